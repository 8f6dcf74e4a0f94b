/* Tests for dist/env.c: every detection rule, its defaults and precedence, the
 * Slurm task-layout and host-list syntax, and every kind of bad value. Each test
 * starts from an environment with none of the variables the rules read and puts
 * the original values back afterwards. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "dist/env.h"

static const char *const VARS[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CTRAIN_TIMEOUT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
};
#define NVARS (sizeof VARS / sizeof VARS[0])
static char *saved[NVARS];

static void clear_env(void)
{
    for (size_t i = 0; i < NVARS; i++) {
        const char *v = getenv(VARS[i]);
        saved[i] = v ? strdup(v) : NULL;
        unsetenv(VARS[i]);
    }
}

static void restore_env(void)
{
    for (size_t i = 0; i < NVARS; i++) {
        if (saved[i]) setenv(VARS[i], saved[i], 1);
        else unsetenv(VARS[i]);
        free(saved[i]);
        saved[i] = NULL;
    }
}

TestSuite(dist_env, .init = clear_env, .fini = restore_env);

static void set(const char *var, const char *val) { cr_assert_eq(setenv(var, val, 1), 0); }

static ct_dist_env detect_ok(void)
{
    ct_dist_env e;
    memset(&e, 0x5a, sizeof e);
    cr_assert_eq(ct_dist_env_detect(&e), CT_OK, "%s", ct_last_error());
    return e;
}

static void expect_env(ct_dist_env e, int rank, int world, int lrank, int lworld, const char *addr, int port,
                       const char *source)
{
    cr_expect_eq(e.rank, rank);
    cr_expect_eq(e.world_size, world);
    cr_expect_eq(e.local_rank, lrank);
    cr_expect_eq(e.local_world_size, lworld);
    cr_expect_str_eq(e.master_addr, addr);
    cr_expect_eq(e.master_port, port);
    cr_expect_str_eq(e.source, source);
}

/* detection fails with CT_ERR_INVALID, leaves *out alone, and the message holds
 * each of the given fragments (the variable, its value) */
static void expect_invalid(const char *frag1, const char *frag2)
{
    ct_dist_env e, before;
    memset(&e, 0x5a, sizeof e);
    before = e;
    cr_assert_eq(ct_dist_env_detect(&e), CT_ERR_INVALID, "expected an error mentioning %s", frag1);
    cr_expect_eq(memcmp(&e, &before, sizeof e), 0, "out was modified on error");
    cr_expect(strstr(ct_last_error(), frag1), "'%s' not in: %s", frag1, ct_last_error());
    if (frag2) cr_expect(strstr(ct_last_error(), frag2), "'%s' not in: %s", frag2, ct_last_error());
}

/* ---- the rules ----------------------------------------------------------------- */

Test(dist_env, single_process_without_any_variable)
{
    ct_dist_env e = detect_ok();
    expect_env(e, 0, 1, 0, 1, "127.0.0.1", 29500, "single");
    cr_expect_eq(e.timeout_s, 300.0);
}

Test(dist_env, empty_variables_count_as_unset)
{
    set("RANK", "");
    set("WORLD_SIZE", "");
    set("MASTER_PORT", "");
    expect_env(detect_ok(), 0, 1, 0, 1, "127.0.0.1", 29500, "single");
}

Test(dist_env, launcher_all_variables)
{
    set("RANK", "5");
    set("WORLD_SIZE", "8");
    set("LOCAL_RANK", "1");
    set("LOCAL_WORLD_SIZE", "4");
    set("MASTER_ADDR", "10.1.2.3");
    set("MASTER_PORT", "1234");
    set("CTRAIN_TIMEOUT", "2.5");
    ct_dist_env e = detect_ok();
    expect_env(e, 5, 8, 1, 4, "10.1.2.3", 1234, "launcher");
    cr_expect_eq(e.timeout_s, 2.5);
}

Test(dist_env, launcher_defaults)
{
    set("RANK", "2");
    set("WORLD_SIZE", "4");
    expect_env(detect_ok(), 2, 4, 2, 4, "127.0.0.1", 29500, "launcher");
    set("MASTER_PORT", "0"); /* the server picks a port */
    cr_expect_eq(detect_ok().master_port, 0);
    set("MASTER_PORT", "65535");
    cr_expect_eq(detect_ok().master_port, 65535);
}

Test(dist_env, launcher_wins_over_mpirun_and_slurm)
{
    set("RANK", "1");
    set("WORLD_SIZE", "2");
    set("OMPI_COMM_WORLD_RANK", "0");
    set("OMPI_COMM_WORLD_SIZE", "4");
    set("SLURM_PROCID", "3");
    set("SLURM_NTASKS", "4");
    expect_env(detect_ok(), 1, 2, 1, 2, "127.0.0.1", 29500, "launcher");
}

static void set_ompi(const char *r, const char *w, const char *lr, const char *lw)
{
    set("OMPI_COMM_WORLD_RANK", r);
    set("OMPI_COMM_WORLD_SIZE", w);
    set("OMPI_COMM_WORLD_LOCAL_RANK", lr);
    set("OMPI_COMM_WORLD_LOCAL_SIZE", lw);
}

Test(dist_env, mpirun_one_node)
{
    set_ompi("3", "4", "3", "4");
    expect_env(detect_ok(), 3, 4, 3, 4, "127.0.0.1", 29500, "mpirun");
}

Test(dist_env, mpirun_nodes_need_master_addr)
{
    set_ompi("5", "8", "1", "4");
    expect_invalid("MASTER_ADDR", NULL);
    set("MASTER_ADDR", "head.cluster");
    set("MASTER_PORT", "40000");
    expect_env(detect_ok(), 5, 8, 1, 4, "head.cluster", 40000, "mpirun");
}

Test(dist_env, mpirun_wins_over_slurm)
{
    set_ompi("1", "2", "1", "2");
    set("SLURM_PROCID", "0");
    set("SLURM_NTASKS", "2");
    cr_expect_str_eq(detect_ok().source, "mpirun");
}

Test(dist_env, mpirun_partial_is_an_error)
{
    set("OMPI_COMM_WORLD_RANK", "1");
    set("OMPI_COMM_WORLD_SIZE", "2");
    expect_invalid("OMPI_COMM_WORLD_LOCAL_RANK", "not set");
}

static void set_slurm(const char *procid, const char *ntasks, const char *localid)
{
    set("SLURM_PROCID", procid);
    set("SLURM_NTASKS", ntasks);
    set("SLURM_LOCALID", localid);
}

Test(dist_env, slurm_node_from_nodeid)
{
    set_slurm("5", "8", "1");
    set("SLURM_TASKS_PER_NODE", "2(x4)");
    set("SLURM_NODEID", "2");
    set("SLURM_JOB_NODELIST", "node[01-04]");
    expect_env(detect_ok(), 5, 8, 1, 2, "node01", 29500, "slurm");
}

Test(dist_env, slurm_task_layouts)
{
    set_slurm("0", "4", "0");
    set("SLURM_JOB_NODELIST", "gpu7");
    set("SLURM_TASKS_PER_NODE", "4");
    cr_expect_eq(detect_ok().local_world_size, 4);
    /* 7 tasks: 2 on each of nodes 0..2, 1 on node 3 */
    set("SLURM_NTASKS", "7");
    set("SLURM_TASKS_PER_NODE", "2(x3),1");
    cr_expect_eq(detect_ok().local_world_size, 2, "no SLURM_NODEID: the first group");
    set("SLURM_PROCID", "6");
    set("SLURM_NODEID", "3");
    cr_expect_eq(detect_ok().local_world_size, 1);
    set("SLURM_PROCID", "5");
    set("SLURM_LOCALID", "1");
    set("SLURM_NODEID", "2");
    cr_expect_eq(detect_ok().local_world_size, 2);
    /* "3,2(x2)": node 0 has 3, nodes 1 and 2 have 2 */
    set("SLURM_TASKS_PER_NODE", "3,2(x2)");
    set("SLURM_NODEID", "0");
    cr_expect_eq(detect_ok().local_world_size, 3);
    set("SLURM_NODEID", "1");
    cr_expect_eq(detect_ok().local_world_size, 2);
}

Test(dist_env, slurm_ntasks_per_node_and_master_addr)
{
    set_slurm("3", "4", "1");
    set("SLURM_NTASKS_PER_NODE", "2");
    set("SLURM_NODEID", "1");
    set("SLURM_JOB_NODELIST", "a,b");
    set("MASTER_PORT", "29600");
    expect_env(detect_ok(), 3, 4, 1, 2, "a", 29600, "slurm");
    set("MASTER_ADDR", "10.0.0.9"); /* overrides the node list */
    expect_env(detect_ok(), 3, 4, 1, 2, "10.0.0.9", 29600, "slurm");
}

Test(dist_env, slurm_without_nodelist)
{
    set_slurm("1", "2", "1");
    set("SLURM_TASKS_PER_NODE", "2");
    expect_env(detect_ok(), 1, 2, 1, 2, "127.0.0.1", 29500, "slurm");
    set("SLURM_TASKS_PER_NODE", "1(x2)");
    set("SLURM_LOCALID", "0");
    set("SLURM_NODEID", "1");
    expect_invalid("MASTER_ADDR", NULL);
    set("SLURM_NODELIST", "n[8-9]"); /* the older name */
    cr_expect_str_eq(detect_ok().master_addr, "n8");
}

Test(dist_env, slurm_needs_both_procid_and_ntasks)
{
    /* an salloc shell: SLURM_NTASKS without being a task */
    set("SLURM_NTASKS", "4");
    set("SLURM_JOB_NODELIST", "node[1-2]");
    cr_expect_str_eq(detect_ok().source, "single");
}

Test(dist_env, slurm_errors)
{
    set_slurm("1", "4", "1");
    expect_invalid("SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE");
    const char *bad[] = {"x", "2(x)", "2(x3", "2(3)", "2,", "2(x0)", "-2", "2(x2)x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        set("SLURM_TASKS_PER_NODE", bad[i]);
        expect_invalid("SLURM_TASKS_PER_NODE", bad[i]);
    }
    set("SLURM_TASKS_PER_NODE", "2(x2)");
    set("SLURM_NODEID", "2");
    expect_invalid("SLURM_NODEID", "2(x2)");
    set("SLURM_NODEID", "0");
    set("SLURM_LOCALID", "2");
    expect_invalid("SLURM_LOCALID=2", NULL);
    set("SLURM_LOCALID", "1");
    set("SLURM_JOB_NODELIST", "node[01-");
    expect_invalid("SLURM_JOB_NODELIST", "node[01-");
    unsetenv("SLURM_LOCALID");
    expect_invalid("SLURM_LOCALID", "not set");
}

/* ---- host lists ------------------------------------------------------------------ */

Test(dist_env, nodelist_first_host)
{
    const char *cases[][2] = {
        {"node[01-04,07],gpu5", "node01"}, {"a,b", "a"}, {"n[3]", "n3"},
        {"gpu5", "gpu5"}, {"node[007-009]", "node007"}, {"rack[2-3]n[005,9]", "rack2n005"},
        {"node[01-02]-ib,x", "node01-ib"}, {"n[10,2-4]", "n10"}, {"host.example.org", "host.example.org"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char host[256];
        cr_expect_eq(ct_dist_nodelist_first(cases[i][0], host, sizeof host), CT_OK, "%s: %s", cases[i][0],
                     ct_last_error());
        cr_expect_str_eq(host, cases[i][1], "%s", cases[i][0]);
    }
}

Test(dist_env, nodelist_malformed)
{
    const char *bad[] = {"", "node[01-", "node[]", "node[a-b]", "node]", ",a", "a,", "a,,b",
                         "node[4-1]", "n[1,]", "n[1-]", "n[-2]", "[", "n[1]]", "a,b[2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char host[256];
        cr_expect_eq(ct_dist_nodelist_first(bad[i], host, sizeof host), CT_ERR_INVALID, "accepted '%s'", bad[i]);
    }
    char small[4];
    cr_expect_eq(ct_dist_nodelist_first("node[1-2]", small, sizeof small), CT_ERR_INVALID);
    cr_expect_eq(ct_dist_nodelist_first("abc,defghij", small, sizeof small), CT_OK, "%s", ct_last_error());
    cr_expect_str_eq(small, "abc");
}

/* ---- bad values -------------------------------------------------------------------- */

Test(dist_env, bad_numbers_name_variable_and_value)
{
    set("WORLD_SIZE", "4");
    const char *bad[] = {"abc", "-1", "1.5", " 1", "1 ", "+1", "0x10", "99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        set("RANK", bad[i]);
        char want[64];
        snprintf(want, sizeof want, "RANK='%s'", bad[i]);
        expect_invalid(want, NULL);
    }
    set("RANK", "1");
    set("LOCAL_WORLD_SIZE", "two");
    expect_invalid("LOCAL_WORLD_SIZE='two'", NULL);
}

Test(dist_env, ranks_out_of_range)
{
    set("RANK", "4");
    set("WORLD_SIZE", "4");
    expect_invalid("RANK=4", "WORLD_SIZE=4");
    set("RANK", "0");
    set("WORLD_SIZE", "0");
    expect_invalid("WORLD_SIZE=0", NULL);
    set("WORLD_SIZE", "4");
    set("LOCAL_RANK", "2");
    set("LOCAL_WORLD_SIZE", "2");
    expect_invalid("LOCAL_RANK=2", "LOCAL_WORLD_SIZE");
    set("LOCAL_RANK", "0");
    set("LOCAL_WORLD_SIZE", "8");
    expect_invalid("LOCAL_WORLD_SIZE", "8");
    set("LOCAL_WORLD_SIZE", "0");
    expect_invalid("LOCAL_WORLD_SIZE", NULL);
    set_ompi("2", "2", "0", "2");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    expect_invalid("OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=2");
}

Test(dist_env, half_a_launcher_pair_is_an_error)
{
    set("RANK", "1");
    expect_invalid("WORLD_SIZE", "not set");
    unsetenv("RANK");
    set("WORLD_SIZE", "2");
    expect_invalid("RANK", "not set");
}

Test(dist_env, bad_port_and_address)
{
    set("RANK", "0");
    set("WORLD_SIZE", "1");
    const char *bad[] = {"65536", "-1", "http", "80a"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        set("MASTER_PORT", bad[i]);
        char want[64];
        snprintf(want, sizeof want, "MASTER_PORT='%s'", bad[i]);
        expect_invalid(want, NULL);
    }
    unsetenv("MASTER_PORT");
    char longaddr[300];
    memset(longaddr, 'h', sizeof longaddr - 1);
    longaddr[sizeof longaddr - 1] = '\0';
    set("MASTER_ADDR", longaddr);
    expect_invalid("MASTER_ADDR", "299");
}

Test(dist_env, timeout_values)
{
    set("CTRAIN_TIMEOUT", "0.25");
    cr_expect_eq(detect_ok().timeout_s, 0.25);
    set("CTRAIN_TIMEOUT", "600");
    cr_expect_eq(detect_ok().timeout_s, 600.0);
    const char *bad[] = {"0", "-5", "abc", "1s", "inf", "nan", " 3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        set("CTRAIN_TIMEOUT", bad[i]);
        char want[64];
        snprintf(want, sizeof want, "CTRAIN_TIMEOUT='%s'", bad[i]);
        expect_invalid(want, NULL);
    }
}

Test(dist_env, null_out)
{
    cr_expect_eq(ct_dist_env_detect(NULL), CT_ERR_INVALID);
}

/* The integer settings of the CTRAIN_* variables: default when unset or empty, digits
 * only, a lower bound, errors naming the variable and its value. */
Test(dist_env, integer_settings)
{
    const char *var = "CTRAIN_TEST_INT_SETTING";
    int x = -1;
    unsetenv(var);
    cr_assert_eq(ct_dist_env_int(var, 4, 1, &x), CT_OK);
    cr_assert_eq(x, 4);
    setenv(var, "", 1);
    cr_assert_eq(ct_dist_env_int(var, 0, 1, &x), CT_OK, "empty counts as unset");
    cr_assert_eq(x, 0);
    setenv(var, "17", 1);
    cr_assert_eq(ct_dist_env_int(var, 4, 1, &x), CT_OK);
    cr_assert_eq(x, 17);
    const char *bad[] = {"0", "-3", "+3", "3x", " 3", "two", "99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv(var, bad[i], 1);
        x = -1;
        cr_assert_eq(ct_dist_env_int(var, 4, 1, &x), CT_ERR_INVALID, "'%s' accepted", bad[i]);
        cr_assert_eq(x, -1, "out changed on error");
        char want[64];
        snprintf(want, sizeof want, "%s='%s' is not an integer >= 1", var, bad[i]);
        cr_assert(strstr(ct_last_error(), want), "'%s' not in: %s", want, ct_last_error());
    }
    unsetenv(var);
}
