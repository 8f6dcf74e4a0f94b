/* What the bundled training examples share (examples/gpt/train.c, examples/llama/train.c,
 * examples/finetune/finetune.c): option parsing, the default corpus (Debian's fortunes),
 * the progress line, loss.csv and its gnuplot chart, the progress state that goes into
 * every checkpoint, AdamW's parameter groups, and mkdir -p.
 *
 * Every message starts with the program's name, set once with ex_set_program.
 */
#ifndef CT_EXAMPLES_TRAIN_UTIL_H
#define CT_EXAMPLES_TRAIN_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "accel/accelerator.h"
#include "accel/checkpoint.h"
#include "data/loader.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

#define EX_FORTUNES_DIR "/usr/share/games/fortunes"

/* The name messages start with ("gpt_train"); the default is "example". */
void ex_set_program(const char *name);
const char *ex_program(void);

/* ---- options --------------------------------------------------------------------- */

/* s as an integer >= lo, or false after a message naming flag and what it expects. */
bool ex_parse_i64(const char *flag, const char *s, int64_t lo, int64_t *out);
/* s as a number in [lo, hi], or false after a message. */
bool ex_parse_f64(const char *flag, const char *s, double lo, double hi, double *out);

/* ---- data ------------------------------------------------------------------------ */

/* The fortune files of EX_FORTUNES_DIR (names without an extension) concatenated in
 * name order: malloc'ed (the caller frees it), *len bytes; NULL after a message. */
char *ex_read_fortunes(size_t *len);

/* A whole file, malloc'ed and NUL-terminated; NULL after a message naming it. */
char *ex_read_file(const char *path, size_t *len);

/* ---- progress -------------------------------------------------------------------- */

double ex_now(void); /* monotonic seconds */

/* A live bar on a terminal (the smoothed loss), one plain line per report otherwise.
 * The plain line starts with what a resumed run reproduces bit for bit, the step's own
 * loss to 6 decimals and the smoothed one (both restored from a checkpoint), and ends
 * with what it does not: speed and times. done: steps this process ran (the ETA's
 * rate; a resumed run starts counting again). */
void ex_progress(bool tty, int64_t step, int64_t steps, int64_t done, double loss, double smooth, double tok_s,
                 double elapsed);

/* Mean of loss_fn over up to n batches of the validation loader from its start, in
 * eval mode and without grad; NAN when no batch gave a loss. */
typedef struct ct_tensor *(*ex_loss_fn)(void *model, struct ct_tensor *x, struct ct_tensor *y);
double ex_evaluate(ct_module *m, ex_loss_fn loss_fn, void *model, ct_loader *val, int64_t n);

/* ---- checkpoints ----------------------------------------------------------------- */

/* What the printed progress carries from step to step besides the model, optimizer,
 * scheduler and loader: the smoothed training loss and the last validation loss.
 * Registered with the Accelerator (ex_progress_checkpointable), so every checkpoint
 * holds it and a resumed run prints what the uninterrupted run printed. */
typedef struct ex_progress_state {
    double smooth, last_val; /* NAN before the first step / the first validation */
} ex_progress_state;

/* The registration for ct_accelerator_register_for_checkpointing, under name. */
ct_checkpointable ex_progress_checkpointable(const char *name, ex_progress_state *ps);

/* ---- files ----------------------------------------------------------------------- */

/* The header of loss.csv; the examples' rows follow it. */
#define EX_CSV_HEADER "step,train_loss,val_loss,lr,tokens_per_s\n"

/* Opens loss.csv for writing with its header. Resuming at step first, it keeps the
 * rows of the steps before first (the killed run's later rows are run again). */
FILE *ex_open_csv(const char *path, int64_t first);

/* mkdir -p: creates path and any missing parents; false with errno set. */
bool ex_make_dirs(const char *path);

/* dir/loss.png from dir/loss.csv (train loss, and val loss where present) with
 * gnuplot, when installed; ylabel names the loss's unit. Prints what it did. */
void ex_plot(const char *dir, const char *ylabel);

/* ---- optimizer ------------------------------------------------------------------- */

/* AdamW groups as in GPT-2 training: decay on matrices (2-D and up: linear weights,
 * embeddings), none on biases and norm weights. weight_decay 0 gives Adam. */
ct_optimizer *ex_make_adamw(ct_module *m, const ct_adam_config *cfg);

/* ---- the training step ------------------------------------------------------------ */

/* After the forward: backward through the Accelerator, *loss_v = this rank's loss,
 * clip the global norm to grad_clip (0 = off), optimizer and schedule step, zero_grad.
 * false when any of it failed (ct_last_error says what). */
bool ex_train_step(ct_accelerator *acc, ct_optimizer *opt, ct_scheduler *sched, ct_tensor *loss, double grad_clip,
                   double *loss_v);
/* --save_every: the log's rows up to this step reach the disk (csv, may be NULL), then the
 * whole training state is saved on every rank (sharded, each writes its part); rank 0
 * says where. false on failure, with a message printed for the log. */
bool ex_checkpoint_step(ct_accelerator *acc, FILE *csv, const char *csv_path, bool tty, int64_t step);
/* The end-of-run figures of DDP (buckets, bytes, exposed communication) and of the
 * sharding engine (bytes sent, per-rank memory), when the run used them. */
void ex_print_strategy_stats(ct_accelerator *acc);

#endif
