/* Tests for parallel/pipeline_schedule.c: the step lists against ones written out by
 * hand for small cases, and a simulation of every stage together for many (p, M):
 * blocking receives, buffered sends, one time unit per step. It finds every run
 * finishing (no deadlock), every receive meeting the send of the same micro-batch in
 * order, the most activations held equal to the formula, and each stage idle for
 * the bubble fraction of the run. The cut of layers into stages against hand-made
 * tables. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "parallel/pipeline_schedule.h"

#define F CT_PIPELINE_FORWARD
#define B CT_PIPELINE_BACKWARD

typedef struct step_ref {
    ct_pipeline_step step;
    int micro;
} step_ref;

/* Checks stage's schedule against want (2M steps), with the transfers they imply. */
static void expect_schedule(ct_pipeline_kind kind, int p, int M, int stage, const step_ref *want)
{
    ct_pipeline_action got[64];
    cr_assert_eq(ct_pipeline_schedule(kind, p, M, stage, got), CT_OK, "%s", ct_last_error());
    for (int i = 0; i < 2 * M; i++) {
        cr_expect(got[i].step == want[i].step && got[i].micro == want[i].micro,
                  "%s p=%d M=%d stage %d step %d: got %c%d, want %c%d", ct_pipeline_kind_name(kind), p, M, stage, i,
                  got[i].step == F ? 'F' : 'B', got[i].micro, want[i].step == F ? 'F' : 'B', want[i].micro);
        int prev = stage > 0 ? stage - 1 : -1, next = stage < p - 1 ? stage + 1 : -1;
        int from = got[i].step == F ? prev : next, to = got[i].step == F ? next : prev;
        cr_expect(got[i].recv_from == from && got[i].send_to == to, "stage %d step %d: recv_from %d send_to %d", stage,
                  i, got[i].recv_from, got[i].send_to);
    }
}

Test(parallel_pipeline_schedule, gpipe_runs_every_forward_then_every_backward)
{
    const step_ref s[] = {{F, 0}, {F, 1}, {F, 2}, {B, 0}, {B, 1}, {B, 2}};
    for (int stage = 0; stage < 2; stage++) expect_schedule(CT_PIPELINE_GPIPE, 2, 3, stage, s);
}

Test(parallel_pipeline_schedule, one_f_one_b_by_hand_for_four_stages_and_six_micro_batches)
{
    /* stage s: min(3 - s, 6) warm-up forwards, then F/B pairs, then the rest of the backwards */
    const step_ref s0[] = {{F, 0}, {F, 1}, {F, 2}, {F, 3}, {B, 0}, {F, 4}, {B, 1}, {F, 5}, {B, 2}, {B, 3}, {B, 4}, {B, 5}};
    const step_ref s1[] = {{F, 0}, {F, 1}, {F, 2}, {B, 0}, {F, 3}, {B, 1}, {F, 4}, {B, 2}, {F, 5}, {B, 3}, {B, 4}, {B, 5}};
    const step_ref s2[] = {{F, 0}, {F, 1}, {B, 0}, {F, 2}, {B, 1}, {F, 3}, {B, 2}, {F, 4}, {B, 3}, {F, 5}, {B, 4}, {B, 5}};
    const step_ref s3[] = {{F, 0}, {B, 0}, {F, 1}, {B, 1}, {F, 2}, {B, 2}, {F, 3}, {B, 3}, {F, 4}, {B, 4}, {F, 5}, {B, 5}};
    expect_schedule(CT_PIPELINE_1F1B, 4, 6, 0, s0);
    expect_schedule(CT_PIPELINE_1F1B, 4, 6, 1, s1);
    expect_schedule(CT_PIPELINE_1F1B, 4, 6, 2, s2);
    expect_schedule(CT_PIPELINE_1F1B, 4, 6, 3, s3);
}

Test(parallel_pipeline_schedule, one_f_one_b_with_fewer_micro_batches_than_stages)
{
    /* M = 2 < p - 1 = 3: stage 0 cannot fill its warm-up; it degenerates to GPipe */
    const step_ref s0[] = {{F, 0}, {F, 1}, {B, 0}, {B, 1}};
    const step_ref s2[] = {{F, 0}, {F, 1}, {B, 0}, {B, 1}};
    const step_ref s3[] = {{F, 0}, {B, 0}, {F, 1}, {B, 1}};
    expect_schedule(CT_PIPELINE_1F1B, 4, 2, 0, s0);
    expect_schedule(CT_PIPELINE_1F1B, 4, 2, 2, s2);
    expect_schedule(CT_PIPELINE_1F1B, 4, 2, 3, s3);
    const step_ref one[] = {{F, 0}, {B, 0}};
    expect_schedule(CT_PIPELINE_1F1B, 1, 1, 0, one);
}

Test(parallel_pipeline_schedule, formulas_by_hand)
{
    cr_expect_eq(ct_pipeline_peak_micro_batches(CT_PIPELINE_GPIPE, 4, 6, 0), 6);
    cr_expect_eq(ct_pipeline_peak_micro_batches(CT_PIPELINE_GPIPE, 4, 6, 3), 6);
    cr_expect_eq(ct_pipeline_peak_micro_batches(CT_PIPELINE_1F1B, 4, 6, 0), 4);
    cr_expect_eq(ct_pipeline_peak_micro_batches(CT_PIPELINE_1F1B, 4, 6, 1), 3);
    cr_expect_eq(ct_pipeline_peak_micro_batches(CT_PIPELINE_1F1B, 4, 6, 3), 1);
    cr_expect_eq(ct_pipeline_peak_micro_batches(CT_PIPELINE_1F1B, 4, 2, 0), 2);
    cr_expect_eq(ct_pipeline_peak_micro_batches(CT_PIPELINE_1F1B, 4, 6, 4), 0); /* no such stage */
    cr_expect_float_eq(ct_pipeline_bubble_fraction(4, 6), 3.0 / 9.0, 1e-15);
    cr_expect_float_eq(ct_pipeline_bubble_fraction(2, 1), 0.5, 1e-15);
    cr_expect_float_eq(ct_pipeline_bubble_fraction(1, 5), 0.0, 1e-15);
}

Test(parallel_pipeline_schedule, bad_arguments_name_the_values)
{
    ct_pipeline_action a[8];
    cr_expect_eq(ct_pipeline_schedule(CT_PIPELINE_1F1B, 2, 2, 2, a), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "stage 2 is outside [0, 2)"), "%s", ct_last_error());
    cr_expect_eq(ct_pipeline_schedule(CT_PIPELINE_GPIPE, 2, 0, 0, a), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "0 micro-batches"), "%s", ct_last_error());
    cr_expect_eq(ct_pipeline_schedule((ct_pipeline_kind)7, 2, 2, 0, a), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "unknown schedule kind 7"), "%s", ct_last_error());
}

/* ---- simulation of all stages ------------------------------------------------------- */

#define MAXP 8
#define MAXM 16

/* A link: the micro-batch ids sent on it and the time each arrives. */
typedef struct link {
    int micro[MAXM], n, taken;
    int at[MAXM];
} link;

typedef struct sim_result {
    bool finished;
    int makespan;
    int busy[MAXP], peak_live[MAXP];
} sim_result;

/* Every stage runs its schedule; a step starts at the first whole time unit at which
 * the stage is free and (if it receives) the message has arrived, lasts one unit, and
 * its send arrives when it ends. A receive must take the micro-batch its step names. */
static sim_result simulate(ct_pipeline_kind kind, int p, int M)
{
    ct_pipeline_action acts[MAXP][2 * MAXM];
    for (int s = 0; s < p; s++) cr_assert_eq(ct_pipeline_schedule(kind, p, M, s, acts[s]), CT_OK);
    link act[MAXP], grad[MAXP]; /* act[s]: s -> s+1; grad[s]: s+1 -> s */
    memset(act, 0, sizeof act);
    memset(grad, 0, sizeof grad);
    int pc[MAXP] = {0}, free_at[MAXP] = {0}, live[MAXP] = {0};
    sim_result r = {0};
    for (int t = 0; t < 8 * (M + p) + 8; t++) {
        bool all_done = true;
        for (int s = 0; s < p; s++) {
            if (pc[s] == 2 * M) continue;
            all_done = false;
            if (free_at[s] > t) continue;
            const ct_pipeline_action *a = &acts[s][pc[s]];
            link *in = a->recv_from < 0 ? NULL : a->step == F ? &act[s - 1] : &grad[s];
            if (in) {
                if (in->taken == in->n || in->at[in->taken] > t) continue; /* not arrived yet: wait */
                cr_assert_eq(in->micro[in->taken], a->micro, "%s p=%d M=%d stage %d: step %c%d received micro %d",
                             ct_pipeline_kind_name(kind), p, M, s, a->step == F ? 'F' : 'B', a->micro,
                             in->micro[in->taken]);
                in->taken++;
            }
            link *out = a->send_to < 0 ? NULL : a->step == F ? &act[s] : &grad[s - 1];
            if (out) {
                out->micro[out->n] = a->micro;
                out->at[out->n++] = t + 1;
            }
            live[s] += a->step == F ? 1 : -1;
            cr_assert_geq(live[s], 0, "stage %d: backward of a micro-batch it did not hold", s);
            if (live[s] > r.peak_live[s]) r.peak_live[s] = live[s];
            r.busy[s]++;
            free_at[s] = t + 1;
            pc[s]++;
            if (t + 1 > r.makespan) r.makespan = t + 1;
        }
        if (all_done) {
            r.finished = true;
            for (int s = 0; s < p; s++) cr_expect_eq(act[s].taken, act[s].n, "stage %d: activations left unread", s);
            return r;
        }
    }
    return r;
}

Test(parallel_pipeline_schedule, every_stage_finishes_in_order_with_the_formulas)
{
    for (int k = 0; k < 2; k++) {
        ct_pipeline_kind kind = k ? CT_PIPELINE_GPIPE : CT_PIPELINE_1F1B;
        for (int p = 1; p <= MAXP; p++)
            for (int M = 1; M <= MAXM; M++) {
                sim_result r = simulate(kind, p, M);
                cr_assert(r.finished, "%s p=%d M=%d: deadlock (some stage never got its message)",
                          ct_pipeline_kind_name(kind), p, M);
                /* equal step times: the run takes 2 (M + p - 1) units */
                cr_expect_eq(r.makespan, 2 * (M + p - 1), "%s p=%d M=%d: makespan %d", ct_pipeline_kind_name(kind), p,
                             M, r.makespan);
                for (int s = 0; s < p; s++) {
                    cr_expect_eq(r.peak_live[s], ct_pipeline_peak_micro_batches(kind, p, M, s),
                                 "%s p=%d M=%d stage %d: held %d micro-batches at most", ct_pipeline_kind_name(kind),
                                 p, M, s, r.peak_live[s]);
                    double idle = (double)(r.makespan - r.busy[s]) / r.makespan;
                    cr_expect_float_eq(idle, ct_pipeline_bubble_fraction(p, M), 1e-12,
                                       "%s p=%d M=%d stage %d: idle %g", ct_pipeline_kind_name(kind), p, M, s, idle);
                }
                if (M > p)
                    for (int s = 0; s < p; s++)
                        cr_expect_lt(ct_pipeline_peak_micro_batches(CT_PIPELINE_1F1B, p, M, s),
                                     ct_pipeline_peak_micro_batches(CT_PIPELINE_GPIPE, p, M, s));
            }
    }
}

/* ---- layers into stages -------------------------------------------------------------- */

Test(parallel_pipeline_schedule, layers_cut_by_count_earlier_stages_take_the_remainder)
{
    /* 10 layers into 4 stages: 3 3 2 2 */
    const int first[] = {0, 3, 6, 8}, count[] = {3, 3, 2, 2};
    for (int s = 0; s < 4; s++) {
        int f = -1, c = -1;
        cr_assert_eq(ct_pipeline_stage_layers(10, 4, s, &f, &c), CT_OK, "%s", ct_last_error());
        cr_expect(f == first[s] && c == count[s], "stage %d: first %d count %d", s, f, c);
    }
    int f, c;
    cr_assert_eq(ct_pipeline_stage_layers(6, 6, 5, &f, &c), CT_OK);
    cr_expect(f == 5 && c == 1);
    cr_assert_eq(ct_pipeline_stage_layers(7, 1, 0, &f, &c), CT_OK);
    cr_expect(f == 0 && c == 7);
}

Test(parallel_pipeline_schedule, more_stages_than_layers_names_both_numbers)
{
    int f, c;
    cr_expect_eq(ct_pipeline_stage_layers(4, 6, 0, &f, &c), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "6 stages for 4 layers"), "%s", ct_last_error());
    cr_expect_eq(ct_pipeline_stage_layers(4, 2, 2, &f, &c), CT_ERR_INVALID);
    cr_expect(strstr(ct_last_error(), "stage 2 is outside [0, 2)"), "%s", ct_last_error());
}
