/* task_media_util.h -- for the tests of request images: decoding one
 * multimodal_data entry (standard base64 with padding) with OpenSSL's
 * EVP_DecodeBlock, so a test compares what was sent with the file bytes. */
#ifndef KVS_TASK_MEDIA_UTIL_H
#define KVS_TASK_MEDIA_UTIL_H
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

/* The bytes of base64 text s (malloc'd, *n their count), or NULL when s is
 * not whole 4-character groups of base64. EVP_DecodeBlock counts the padding
 * as zero bytes: they are taken off again. */
static inline unsigned char *media_b64_decode(const char *s, size_t *n) {
    size_t len = s ? strlen(s) : 0;
    *n = 0;
    if (len == 0 || len % 4 != 0) return NULL;
    unsigned char *out = malloc(len / 4 * 3 + 1);
    if (!out) return NULL;
    int w = EVP_DecodeBlock(out, (const unsigned char *)s, (int)len);
    if (w < 0) {
        free(out);
        return NULL;
    }
    size_t pad = (s[len - 1] == '=') + (s[len - 2] == '=');
    *n = (size_t)w - pad;
    return out;
}
#endif
