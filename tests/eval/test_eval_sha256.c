/* test_eval_sha256.c -- SHA-256 against FIPS 180-4 / NIST test vectors, and
 * incremental updates in random chunk sizes against the one-shot digest. */
#include "kvs_eval.h"
#include "test_util.h"

static void hex_of(kvs_sha256_ctx *c, char out[65]) {
    uint8_t d[32];
    kvs_sha256_final(c, d);
    for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

int main(void) {
    char h[65];
    kvs_sha256_hex("", 0, h);
    CHECK(!strcmp(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    kvs_sha256_hex("abc", 3, h);
    CHECK(!strcmp(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 448 bits */
    kvs_sha256_hex(two, strlen(two), h);
    CHECK(!strcmp(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    const char *four = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    kvs_sha256_hex(four, strlen(four), h);
    CHECK(!strcmp(h, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"));
    /* one million 'a' in chunks of 1000 */
    kvs_sha256_ctx c;
    char buf[1000];
    memset(buf, 'a', sizeof buf);
    kvs_sha256_init(&c);
    for (int i = 0; i < 1000; i++) kvs_sha256_update(&c, buf, sizeof buf);
    hex_of(&c, h);
    CHECK(!strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
    /* property: any chunking gives the one-shot digest (lengths around block edges) */
    uint64_t rng = 42;
    unsigned char data[300];
    for (int i = 0; i < 300; i++) data[i] = (unsigned char)(kvs_rng_next(&rng) & 0xff);
    for (int n = 0; n <= 300; n += 7) {
        char a[65], b[65];
        kvs_sha256_hex(data, (size_t)n, a);
        kvs_sha256_init(&c);
        size_t off = 0;
        while (off < (size_t)n) {
            size_t k = 1 + kvs_rng_next(&rng) % 70;
            if (k > (size_t)n - off) k = (size_t)n - off;
            kvs_sha256_update(&c, data + off, k);
            off += k;
        }
        hex_of(&c, b);
        CHECK_MSG(!strcmp(a, b), "n=%d", n);
    }
    return kvs_test_finish("test_eval_sha256");
}
