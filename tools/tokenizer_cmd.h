/* `ctrain tokenizer train|encode`: training a byte-level BPE tokenizer on text files
 * (ct_bpe_train, data/bpe_train.h) and encoding text files into an llm.c token file
 * (ct_bpe_encode_files, data/bpe.h). docs/guide.md, "Training a tokenizer". */
#ifndef CT_TOOLS_TOKENIZER_CMD_H
#define CT_TOOLS_TOKENIZER_CMD_H

/* argv[0] is "tokenizer", argv[1] the action. Exit code 0 on success, 1 when
 * training, encoding or writing fails (the reason on stderr), 2 for a usage error:
 * an unknown flag, a bad number, a vocab_size below the special tokens + 256, an
 * input file that does not exist or cannot be read. */
int ct_tokenizer_main(int argc, char **argv);

#endif
