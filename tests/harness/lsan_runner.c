/* LeakSanitizer and Criterion's runner.
 *
 * Criterion runs each test in a worker process that BoxFort starts as
 * "boxfort-worker"; the process that starts them (the runner) is Criterion's own code,
 * and keeps a small record per `.timeout` test that it never frees when tests run in
 * parallel. Under AddressSanitizer the runner ignores its own allocations, so that
 * record is not reported; the workers, the ranks they fork and every program a test
 * starts stay fully checked. (A suppression cannot single out the runner: every
 * test's stack passes through libcriterion too.)
 */
#include <errno.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>

__attribute__((constructor)) static void lsan_ignore_the_runner(void)
{
    /* allocations of this thread (the runner's main thread) from here on are not leaks */
    if (strcmp(program_invocation_short_name, "boxfort-worker") != 0) __lsan_disable();
}
#else
/* ISO C wants a translation unit to declare something */
typedef int lsan_runner_unused;
#endif
