/* cuBLASLt opened on first use (core/cublaslt_loader.h). */
#include "core/cublaslt_loader.h"

#ifdef CT_HAVE_CUDA
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "core/error.h"

#define CT_STR_(x) #x
#define CT_STR(x) CT_STR_(x)
/* the soname of the toolkit ctrain was built with: libcublasLt.so.<major> */
#define LT_SONAME "libcublasLt.so." CT_STR(CUBLAS_VER_MAJOR)

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cti_cublaslt_api api;
static atomic_int state; /* 0 not tried, 1 loaded, -1 failed */
static char why[512];

static void load(void)
{
    void *h = dlopen(LT_SONAME, RTLD_NOW | RTLD_LOCAL);
#ifdef CT_CUDA_LIBDIR
    /* the toolkit's folder when it is not on the loader's path */
    if (!h) h = dlopen(CT_CUDA_LIBDIR "/" LT_SONAME, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!h) {
        snprintf(why, sizeof why, "cannot open %s: %s", LT_SONAME, dlerror());
        atomic_store(&state, -1);
        return;
    }
    struct {
        const char *name;
        void **slot;
    } fns[] = {
#define FN(f) {"cublasLt" #f, (void **)&api.f}
        FN(Create), FN(GetStatusName), FN(GetStatusString), FN(Matmul), FN(MatmulAlgoGetHeuristic),
        FN(MatmulDescCreate), FN(MatmulDescDestroy), FN(MatmulDescSetAttribute), FN(MatmulPreferenceCreate),
        FN(MatmulPreferenceDestroy), FN(MatmulPreferenceSetAttribute), FN(MatrixLayoutCreate),
        FN(MatrixLayoutDestroy), FN(MatrixLayoutSetAttribute),
#undef FN
    };
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++) {
        *fns[i].slot = dlsym(h, fns[i].name);
        if (!*fns[i].slot) {
            snprintf(why, sizeof why, "%s has no %s: %s", LT_SONAME, fns[i].name, dlerror());
            dlclose(h);
            atomic_store(&state, -1);
            return;
        }
    }
    /* kept open for the life of the process: handles and algorithms point into it */
    atomic_store(&state, 1);
}

const cti_cublaslt_api *cti_cublaslt(const char *op)
{
    pthread_once(&once, load);
    if (atomic_load(&state) == 1) return &api;
    ct_error_set(CT_ERR_DEVICE, "%s: cuBLASLt is needed for GPU matmuls and %s (the CUDA toolkit's lib folder on "
                                "the loader's path, e.g. LD_LIBRARY_PATH, makes it found)",
                 op ? op : "cublaslt", why);
    return NULL;
}

int cti_cublaslt_loaded(void) { return atomic_load(&state) == 1; }
#endif
