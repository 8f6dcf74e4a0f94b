/* GPU conformance for the device layer (core/cuda_*.c, core/cuda_copy.cu): copies
 * between host and device in every dtype, strided copies and casts on the device
 * bit for bit against the CPU's conversions, fills, element access, printing,
 * streams and events, the caching allocator over cudaMalloc (reuse, statistics,
 * out-of-memory message, empty_cache) and error reports. Skipped, with the reason,
 * where no GPU can be used. */
#include <string.h>

#include "../gpu_conformance.h"

static const ct_dtype ALL_DTYPES[] = {CT_DTYPE_F32, CT_DTYPE_F64, CT_DTYPE_F16, CT_DTYPE_BF16, CT_DTYPE_F8_E4M3,
                                      CT_DTYPE_F8_E5M2, CT_DTYPE_I32, CT_DTYPE_I64, CT_DTYPE_U8, CT_DTYPE_BOOL};
#define N_DTYPES (int)(sizeof ALL_DTYPES / sizeof ALL_DTYPES[0])

/* Values that exercise every conversion rule: signed zeros, subnormals of each
 * format, ties, overflow, inf, NaN, integers beyond 2^24 and 2^53. */
static ct_tensor *special_values(void)
{
    static const double v[] = {0.0, -0.0, 1.0, -1.5, 0.1, 1e-8, -3e-5, 2.0 / 3.0, 65504.0, 65520.0, 448.0, 464.0,
                               57344.0, 61440.0, 1e30, -1e30, 3.4e38, 1e-45, 16777217.0, 9007199254740993.0,
                               -2147483649.0, 300.0, -1.0, 255.5, 1.0 / 0.0, -1.0 / 0.0, 0.0 / 0.0, 7.5, -7.5,
                               0.00048828125, 1.00390625, 1.005859375};
    int64_t n = (int64_t)(sizeof v / sizeof v[0]);
    return ct_tensor_from_data(CT_DTYPE_F64, 1, &n, v);
}

Test(gpu_core, round_trip_every_dtype)
{
    GPU_REQUIRE();
    CT_FRAME {
        for (int i = 0; i < N_DTYPES; i++) {
            ct_tensor *h = ct_tensor_cast(gpu_rand_cpu(CT_DTYPE_F64, 3, (const int64_t[]){5, 7, 3}, 11 + i, -100, 100),
                                          ALL_DTYPES[i]);
            ct_tensor *d = gpu_of(h);
            cr_assert_not_null(d, "%s: %s", ct_dtype_name(ALL_DTYPES[i]), ct_last_error());
            cr_assert_eq(d->device.type, CT_DEVICE_CUDA);
            cr_assert_eq(d->dtype, h->dtype);
            gpu_expect_equal(d, h, ct_dtype_name(ALL_DTYPES[i]));
        }
    }
}

Test(gpu_core, large_copies_cross_the_staging_buffers)
{
    GPU_REQUIRE();
    CT_FRAME {
        /* 40 MiB: five staging chunks, an odd tail */
        ct_tensor *h = gpu_rand_cpu(CT_DTYPE_F32, 1, (const int64_t[]){10 * 1024 * 1024 + 13}, 5, -1, 1);
        gpu_expect_equal(gpu_of(h), h, "40 MiB f32");
    }
}

Test(gpu_core, casts_match_the_cpu_bit_for_bit)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *v = special_values();
        for (int i = 0; i < N_DTYPES; i++) {
            ct_tensor *src = ct_tensor_cast(v, ALL_DTYPES[i]);
            ct_tensor *dsrc = gpu_of(src);
            for (int j = 0; j < N_DTYPES; j++) {
                char what[96];
                snprintf(what, sizeof what, "cast %s -> %s", ct_dtype_name(ALL_DTYPES[i]), ct_dtype_name(ALL_DTYPES[j]));
                gpu_expect_equal(ct_tensor_cast(dsrc, ALL_DTYPES[j]), ct_tensor_cast(src, ALL_DTYPES[j]), what);
                if (ALL_DTYPES[j] == CT_DTYPE_F8_E4M3 || ALL_DTYPES[j] == CT_DTYPE_F8_E5M2) {
                    strcat(what, " (saturating)");
                    gpu_expect_equal(ct_tensor_cast_saturate(dsrc, ALL_DTYPES[j]),
                                     ct_tensor_cast_saturate(src, ALL_DTYPES[j]), what);
                }
            }
        }
    }
}

Test(gpu_core, strided_and_broadcast_copies)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_tensor *h = gpu_rand_cpu(CT_DTYPE_F32, 3, (const int64_t[]){4, 6, 9}, 3, -5, 5);
        ct_tensor *d = gpu_of(h);
        /* a transposed view made contiguous on the device */
        gpu_expect_equal(ct_tensor_contiguous(ct_tensor_transpose(d, 0, 2)),
                         ct_tensor_contiguous(ct_tensor_transpose(h, 0, 2)), "transpose");
        gpu_expect_equal(ct_tensor_contiguous(ct_tensor_slice(d, 2, 1, 8, 3)),
                         ct_tensor_contiguous(ct_tensor_slice(h, 2, 1, 8, 3)), "slice with step");
        /* a non-contiguous GPU tensor copied to the host */
        gpu_expect_equal(ct_tensor_permute(d, (const int[]){2, 0, 1}), ct_tensor_permute(h, (const int[]){2, 0, 1}),
                         "permuted view to the host");
        /* broadcast into a strided destination, with a cast */
        ct_tensor *row = gpu_rand_cpu(CT_DTYPE_F64, 1, (const int64_t[]){9}, 4, -1, 1);
        ct_tensor *hd = ct_tensor_zeros(CT_DTYPE_BF16, CT_SHAPE(9, 4));
        ct_tensor *dd = gpu_of(hd);
        cr_assert_eq(ct_tensor_copy_(ct_tensor_transpose(ct_tensor_slice(hd, 1, 0, 4, 1), 0, 1), row), CT_OK);
        cr_assert_eq(ct_tensor_copy_(ct_tensor_transpose(ct_tensor_slice(dd, 1, 0, 4, 1), 0, 1), gpu_of(row)), CT_OK,
                     "%s", ct_last_error());
        gpu_expect_equal(dd, hd, "broadcast into a transposed bf16 view");
        /* copy_ straight from the host into a device view, and back */
        ct_tensor *back = ct_tensor_zeros(CT_DTYPE_F32, CT_SHAPE(4, 6, 9));
        cr_assert_eq(ct_tensor_copy_(back, d), CT_OK);
        gpu_expect_equal(d, back, "device -> host copy_");
    }
}

Test(gpu_core, fill_zeros_like_and_elements)
{
    GPU_REQUIRE();
    CT_FRAME {
        for (int i = 0; i < N_DTYPES; i++) {
            ct_tensor *h = ct_tensor_empty(ALL_DTYPES[i], CT_SHAPE(3, 5));
            ct_tensor *d = ct_tensor_empty_on(CT_CUDA(0), ALL_DTYPES[i], CT_SHAPE(3, 5));
            cr_assert_not_null(d);
            cr_assert_eq(ct_tensor_fill_(h, -2.75), CT_OK);
            cr_assert_eq(ct_tensor_fill_(d, -2.75), CT_OK, "%s", ct_last_error());
            gpu_expect_equal(d, h, ct_dtype_name(ALL_DTYPES[i]));
            ct_tensor *z = ct_tensor_zeros_like(d);
            cr_assert_eq(z->device.type, CT_DEVICE_CUDA, "zeros_like keeps the device");
            gpu_expect_equal(z, ct_tensor_zeros(ALL_DTYPES[i], CT_SHAPE(3, 5)), "zeros_like");
        }
        ct_tensor *d = gpu_of(ct_tensor_arange(CT_DTYPE_F32, 0, 12, 1));
        cr_assert_float_eq(ct_tensor_get(d, (const int64_t[]){7}), 7.0, 0);
        cr_assert_eq(ct_tensor_set(d, (const int64_t[]){7}, -1.25), CT_OK);
        cr_assert_float_eq(ct_tensor_get(d, (const int64_t[]){7}), -1.25, 0);
        cr_assert_float_eq(ct_tensor_item(ct_tensor_narrow(d, 0, 3, 1)), 3.0, 0);
        ct_error_clear();
        cr_assert(isnan(ct_tensor_get(d, (const int64_t[]){12})), "out of range");
        cr_assert(strstr(ct_last_error(), "out of range"), "%s", ct_last_error());
        char *s = ct_tensor_to_string(d);
        cr_assert(s && strstr(s, "-1.25") && strstr(s, "cuda:0"), "printed from the device: %s", s);
        free(s);
    }
}

Test(gpu_core, streams_and_events_order_work)
{
    GPU_REQUIRE();
    ct_cuda_stream *side = ct_cuda_stream_new(0);
    ct_cuda_event *ev = ct_cuda_event_new(0, false);
    cr_assert(side && ev, "%s", ct_last_error());
    CT_FRAME {
        ct_tensor *d = ct_tensor_empty_on(CT_CUDA(0), CT_DTYPE_F32, CT_SHAPE(1 << 22));
        cr_assert_eq(ct_tensor_fill_(d, 3.0), CT_OK); /* on the default stream */
        cr_assert_eq(ct_cuda_event_record(ev, NULL), CT_OK);
        cr_assert_eq(ct_cuda_event_wait(ev, side), CT_OK);
        cr_assert_eq(ct_cuda_stream_set(side), CT_OK);
        cr_assert_eq(ct_cuda_stream_current(0), side);
        cr_assert_eq(ct_tensor_fill_(ct_tensor_narrow(d, 0, 0, 10), 5.0), CT_OK); /* on the side stream, after ev */
        cr_assert_eq(ct_cuda_stream_synchronize(side), CT_OK);
        ct_cuda_stream_reset(0);
        cr_assert_neq(ct_cuda_stream_current(0), side);
        cr_assert_eq(ct_cuda_event_query(ev), 1);
        cr_assert_float_eq(ct_tensor_get(d, (const int64_t[]){9}), 5.0, 0);
        cr_assert_float_eq(ct_tensor_get(d, (const int64_t[]){10}), 3.0, 0);
    }
    cr_assert_eq(ct_cuda_synchronize(0), CT_OK);
    ct_cuda_event_free(ev);
    ct_cuda_stream_free(side);
    ct_cuda_event *a = ct_cuda_event_new(0, true), *b = ct_cuda_event_new(0, true);
    float ms = -1;
    cr_assert_eq(ct_cuda_event_record(a, NULL), CT_OK);
    cr_assert_eq(ct_cuda_event_record(b, NULL), CT_OK);
    cr_assert_eq(ct_cuda_event_synchronize(b), CT_OK);
    cr_assert_eq(ct_cuda_event_elapsed(a, b, &ms), CT_OK);
    cr_assert_geq(ms, 0.0f);
    ct_cuda_event_free(a);
    ct_cuda_event_free(b);
}

Test(gpu_core, allocator_reuses_and_counts)
{
    GPU_REQUIRE();
    ct_cuda_memory_stats s0, s1, s2;
    cr_assert_eq(ct_cuda_empty_cache(), CT_OK);
    cr_assert_eq(ct_cuda_memory_stats_get(0, &s0), CT_OK);
    CT_FRAME {
        ct_tensor *t = ct_tensor_empty_on(CT_CUDA(0), CT_DTYPE_F32, CT_SHAPE(1 << 20));
        cr_assert_not_null(t);
        cr_assert_eq(ct_cuda_memory_stats_get(0, &s1), CT_OK);
        cr_assert_eq(s1.allocated - s0.allocated, 4 << 20, "4 MiB in a tensor");
        cr_assert_geq(s1.peak_allocated, s1.allocated);
    }
    cr_assert_eq(ct_cuda_memory_stats_get(0, &s2), CT_OK);
    cr_assert_eq(s2.allocated, s0.allocated, "freed with its frame");
    cr_assert_eq(s2.reserved, s1.reserved, "kept in the cache");
    for (int step = 0; step < 5; step++) CT_FRAME {
            cr_assert_not_null(ct_tensor_empty_on(CT_CUDA(0), CT_DTYPE_F32, CT_SHAPE(1 << 20)));
        }
    ct_cuda_memory_stats s3;
    cr_assert_eq(ct_cuda_memory_stats_get(0, &s3), CT_OK);
    cr_assert_eq(s3.num_device_allocs, s2.num_device_allocs, "the same size comes from the cache");
    cr_assert_eq(ct_cuda_empty_cache(), CT_OK);
    cr_assert_eq(ct_cuda_memory_stats_get(0, &s3), CT_OK);
    cr_assert_eq(s3.reserved, s3.allocated, "nothing cached after empty_cache");
}

Test(gpu_core, out_of_memory_is_an_error_with_the_numbers)
{
    GPU_REQUIRE();
    CT_FRAME {
        ct_error_clear();
        /* 1 PiB */
        ct_tensor *t = ct_tensor_empty_on(CT_CUDA(0), CT_DTYPE_U8, CT_SHAPE((int64_t)1 << 50));
        cr_assert_null(t);
        cr_assert_eq(ct_last_status(), CT_ERR_NOMEM);
        const char *m = ct_last_error();
        cr_assert(strstr(m, "out of memory") && strstr(m, "cuda:0") && strstr(m, "1048576.00 GiB"), "%s", m);
        cr_assert(strstr(m, "allocated") && strstr(m, "reserved") && strstr(m, "free of"), "%s", m);
        /* the device still works */
        ct_tensor *ok = gpu_of(ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(8)));
        cr_assert_not_null(ok, "%s", ct_last_error());
        cr_assert_float_eq(ct_tensor_get(ok, (const int64_t[]){7}), 1.0, 0);
    }
}

Test(gpu_core, bad_device_and_mixed_devices_are_errors)
{
    GPU_REQUIRE();
    CT_FRAME {
        int n = ct_cuda_device_count();
        ct_error_clear();
        cr_assert_null(ct_tensor_empty_on(CT_CUDA(n), CT_DTYPE_F32, CT_SHAPE(2)));
        char want[32];
        snprintf(want, sizeof want, "cuda:%d", n);
        cr_assert(strstr(ct_last_error(), want) && strstr(ct_last_error(), "no device"), "%s", ct_last_error());
        ct_tensor *a = ct_tensor_ones(CT_DTYPE_F32, CT_SHAPE(4));
        ct_tensor *b = gpu_of(a);
        ct_error_clear();
        cr_assert_null(ct_kernel_binary(CT_BINARY_ADD, a, b));
        cr_assert(strstr(ct_last_error(), "cpu") && strstr(ct_last_error(), "cuda:0"), "names both devices: %s",
                  ct_last_error());
    }
}

Test(gpu_core, device_properties)
{
    GPU_REQUIRE();
    ct_cuda_device_props p;
    cr_assert_eq(ct_cuda_device_props_get(0, &p), CT_OK, "%s", ct_last_error());
    cr_assert_gt(strlen(p.name), 0);
    cr_assert_geq(p.major, 7);
    cr_assert_gt(p.multiprocessors, 0);
    cr_assert_gt(p.total_memory, 0);
    cr_assert_gt(p.free_memory, 0);
}
