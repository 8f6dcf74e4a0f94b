/* `ctrain generate --model DIR --prompt TEXT`: text from a causal language model in
 * Hugging Face's layout (nn/lm.h, nn/generate.h), printed as it is produced
 * (docs/guide.md, "Generating text"). */
#ifndef CT_TOOLS_GENERATE_CMD_H
#define CT_TOOLS_GENERATE_CMD_H

/* argv[0] is "generate". Exit code 0 after the text was printed, 1 when generation
 * fails, 2 for a usage error or input that does not fit (missing model directory or
 * tokenizer, a bad number, a prompt too long for the model). */
int ct_generate_main(int argc, char **argv);

#endif
