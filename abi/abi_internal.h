/*
 * abi_internal.h -- what abi.c and abi_tensor.c share: the context and plan
 * objects behind the opaque handles of kvsieve_abi.h, and the tensor
 * descriptor helpers. Not installed, not part of the ABI.
 */
#ifndef KVS_ABI_INTERNAL_H
#define KVS_ABI_INTERNAL_H

#include "kvsieve.h"
#include "kvsieve_abi.h"
#include "kvs_kernels.h" /* without CUDA: the stubs that say "built without CUDA" */

/* What the context knows of one fed layer besides its views: whether it
 * was set, its device ordinal, and the copies the context made for tensors
 * that could not be read in place ([3]: k, v, q). */
typedef struct {
    int set;
    int device_index;
    void *copy[3];
} abi_layer;

struct kvs_abi_ctx {
    int threads;
    int n_layers;
    kvs_layer *views;   /* [n_layers] what kvs_compress reads */
    abi_layer *layers;  /* [n_layers] */
    uint8_t *modality;  /* [n_modality] owned copy, or NULL */
    int64_t n_modality;
    uint64_t generation; /* bumped by every kvs_abi_cache_begin */
    kvs_abi_stats stats;
    kvs_dense_cache scratch; /* one layer of fp32 apply output, reused */
#ifdef KVSIEVE_HAVE_CUDA
    kvs_gpu_workspace *ws;
    kvs_shape ws_shape;
    int ws_device;
#endif
    kvs_err err; /* the last call's message */
};

struct kvs_abi_plan {
    const kvs_abi_ctx *owner;
    uint64_t generation; /* the owner's cache generation the plan was made from */
    kvs_plan plan;
    kvs_params params;
    const kvs_method *m;          /* the method that made it */
    struct kvs_composed *owned;   /* m when composed from a description (freed with the plan) */
    char method[32];
    int device; /* KVS_ABI_HOST / KVS_ABI_CUDA */
    double compress_ms;
};

/* Reads a caller's struct of `have` bytes into a zeroed local of `size`
 * bytes (the struct_size rule of kvsieve_abi.h). `what` names it in errors;
 * min_size is the size of the 1.0 struct. */
kvs_status abi_read_struct(const void *in, size_t size, size_t min_size, void *local, const char *what,
                           kvs_err *err);

/* Turn a K / V / Q descriptor into a core view ([H][N][d]). When the
 * tensor cannot be read in place (see kvsieve_abi.h, Tensors) and is host
 * memory, *copy receives a malloc'd contiguous copy (the view points into
 * it) and *copied_bytes its size; a CUDA tensor that would need one is
 * KVS_ERR_UNSUPPORTED. `what` is "layer 3: k". */
kvs_status abi_view_from_tensor(const kvs_abi_tensor *t, const char *what, kvs_view *out,
                                int *device_index, void **copy, int64_t *copied_bytes, kvs_err *err);

/* A host output tensor of dtype in `allowed` (bit mask of 1 << KVS_ABI_*)
 * and the 2- or 3-dim shape dims[0..nd) (an extra leading 1 accepted):
 * fills elem strides st[0..nd). `what` names it. device: the required
 * device (KVS_ABI_HOST or KVS_ABI_CUDA); CUDA outputs must be contiguous. */
kvs_status abi_check_out(const kvs_abi_tensor *t, const char *what, unsigned allowed, int device,
                         int device_index, int nd, const int64_t *dims, int64_t *st, kvs_err *err);

size_t abi_dtype_size(int dtype); /* 0 for unknown */
const char *abi_dtype_name(int dtype);

#endif
