# ctrain — build, test, sanitize, fuzz, bench, install.
#
#   make            libctrain.so + libctrain.a       make test    the whole suite
#   make asan       the suite under ASan + UBSan     make fuzz    each fuzz target, bounded
#   make bench      kernel benchmarks                make install PREFIX=/usr/local DESTDIR=
#   make bench-gpt  GPT training vs PyTorch CPU     make bench-collectives  allreduce vs OpenMPI, gloo
#   make bench-ddp  2-process GPT vs PyTorch DDP, Accelerate
#   make bench-checkpoint  save_state / load_state vs Accelerate and the disk
#   make bench-gpu  GPT-2 124M on one GPU vs PyTorch eager and torch.compile, kernels vs peak
#   make bench-tokenizer  byte-level BPE encoding vs Hugging Face tokenizers, one thread
#   make train      the README's main job            make clean
#   make generate MODEL=DIR PROMPT=TEXT  text from a model saved in Hugging Face's layout (examples/generate)
#   make llama      a small Llama + BPE tokenizer on the fortunes (examples/llama/train.c)
#   make finetune MODEL=DIR  question/answer fine-tuning of a saved GPT-2 or Llama (examples/finetune)
#   make api-doc    regenerates docs/api.md from the public headers (tools/api_doc.py)
#
# PORTABLE=1 builds for any x86-64 instead of -march=native.
# CUDA: the CUDA backend is built whenever nvcc is found (CUDA=0 leaves it out;
# CUDA_HOME is the toolkit, CUDA_ARCH the nvcc -gencode list). The binaries run
# unchanged where there is no GPU or no driver: ctrain then uses the CPU.
#   make test-gpu   the GPU conformance suite (tests/gpu/run.sh adds compute-sanitizer and the benchmark)

PREFIX   ?= /usr/local
DESTDIR  ?=
BUILD    ?= build
CC       ?= cc
OPT      ?= -O3
PORTABLE ?= 0
FUZZ_SECONDS ?= 30

ifeq ($(PORTABLE),1)
ARCH ?= -march=x86-64-v2 -mtune=generic
else
ARCH ?= -march=native
endif

VERSION  := 0.1.0
# sub-makes build in parallel unless the caller already chose -j
JOBS     := $(if $(findstring j,$(firstword -$(MAKEFLAGS))),,-j$(shell nproc 2>/dev/null || echo 2))
LIB_DIRS := core kernels kernels/cpu precision autograd nn optim data dist parallel accel
LIB_SRC  := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))

CUDA_HOME ?= /usr/local/cuda
NVCC     ?= $(firstword $(wildcard $(CUDA_HOME)/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA     ?= $(if $(NVCC),1,0)
# a fat binary for Ampere, Hopper and Blackwell, plus PTX that later GPUs JIT-compile
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_100,code=[sm_100,compute_100]
ifeq ($(CUDA),1)
LIB_CU    := $(wildcard core/*.cu kernels/cuda/*.cu)
CUDA_DEFS := -DCT_HAVE_CUDA -I$(CUDA_HOME)/include
# the runtime is linked statically (it loads the driver at run time, so a machine
# without one still runs the binary); cuBLASLt is opened with dlopen by the first GPU
# matmul (core/cublaslt_loader.c): linked, it would cost every process ~146 MiB resident
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
CUDA_DEFS += -DCT_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"'
NVCC_FLAGS = -std=c++17 $(OPT) $(CUDA_ARCH) -lineinfo -DCTRAIN_VERSION='"$(VERSION)"' $(CUDA_DEFS) -I. \
             -Werror all-warnings -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror,-Wno-unknown-pragmas \
             -MMD -MP $(NVCCFLAGS)
else
LIB_CU    :=
CUDA_DEFS :=
CUDA_LIBS :=
endif
# the public headers: ctrain.h and what it includes (*_internal.h and kernels/cpu/ are private)
LIB_HDR  := ctrain.h $(shell sed -n 's/^\#include "\(.*\)"/\1/p' ctrain.h)
TEST_SRC := $(wildcard tests/*/*.c tests/*/*/*.c)
# bench/collectives/allreduce_mpi.c needs mpicc: bench/collectives/run.sh builds it
BENCH_SRC := $(filter-out bench/collectives/allreduce_mpi.c,$(wildcard bench/*/*.c))
FUZZ_SRC := $(wildcard fuzz/*.c)
CLI_SRC  := $(wildcard tools/*.c)

WARN     := -Wall -Wextra -Werror -Wno-unknown-pragmas
SAN      ?=
# -fvisibility=hidden: libctrain.so exports only what the public headers mark CT_API (core/api.h)
ALL_CFLAGS  = -std=c11 -D_GNU_SOURCE -DCTRAIN_VERSION='"$(VERSION)"' $(OPT) $(ARCH) -g -fPIC -fvisibility=hidden -fopenmp $(WARN) -I. $(CUDA_DEFS) -MMD -MP $(SAN) $(CFLAGS)
ALL_LDFLAGS = -fopenmp $(SAN) $(LDFLAGS)
LDLIBS   += -lopenblas -ldnnl -lcjson -lyaml -luv -lxxhash -lpcre2-8 $(CUDA_LIBS) -lm -lpthread

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(LIB_CU:%.cu=$(BUILD)/obj/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
SO       := $(BUILD)/lib/libctrain.so
AR_LIB   := $(BUILD)/lib/libctrain.a
TEST_BIN := $(BUILD)/tests/ctrain_tests
# the `ctrain` command (tools/): launch and the other subcommands
CLI_BIN  := $(if $(CLI_SRC),$(BUILD)/bin/ctrain)
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))

.PHONY: all setup test test-gpu asan api-doc memcheck fuzz bench bench-gpt bench-gpu bench-collectives bench-ddp bench-strategies bench-checkpoint bench-tokenizer install uninstall clean train generate llama finetune
.DEFAULT_GOAL := all

all: setup
	@$(MAKE) --no-print-directory $(JOBS) $(SO) $(AR_LIB) $(GPT_BIN) $(QUICK_BIN) $(GEN_BIN) $(LLAMA_BIN) $(FINETUNE_BIN) $(CLI_BIN)

setup:
	@./tools/setup.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(SO): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libctrain.so.0 $(ALL_LDFLAGS) -o $@ $^ $(LDLIBS)

$(AR_LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/bin/ctrain: $(CLI_OBJ) $(AR_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(CLI_OBJ) $(AR_LIB) $(LDLIBS)

# the tests call the command's functions in-process (the questionnaire, the config
# file's reader): every tools/ object but the one holding main
TEST_CLI_OBJ := $(filter-out $(BUILD)/obj/tools/ctrain.o,$(CLI_OBJ))

$(TEST_BIN): $(TEST_OBJ) $(TEST_CLI_OBJ) $(AR_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(TEST_OBJ) $(TEST_CLI_OBJ) $(AR_LIB) -lcriterion $(LDLIBS)

# The suite: one Criterion binary, every test in its own process with a timeout.
# Criterion's closing "Synthesis" line is the summary CI reads. Tests that run the
# `ctrain` command or the examples find them through CTRAIN_BIN and CTRAIN_EXAMPLES;
# the export check (tests/tools/test_exports.c) reads CTRAIN_LIB and CTRAIN_SRC.
# CTRAIN_CONFIG_FILE names no file, so `ctrain launch` in the tests never reads the
# user's default launch configuration.
NO_USER_CONFIG = CTRAIN_CONFIG_FILE=$(abspath $(BUILD))/tests/no-default-config.yaml
test: setup
	@$(MAKE) --no-print-directory $(JOBS) $(SO) $(TEST_BIN) $(CLI_BIN) $(GPT_BIN) $(QUICK_BIN) $(GEN_BIN) $(LLAMA_BIN) $(FINETUNE_BIN)
	CTRAIN_BIN=$(abspath $(BUILD)/bin/ctrain) CTRAIN_EXAMPLES=$(abspath $(BUILD)/examples) \
	CTRAIN_LIB=$(abspath $(SO)) CTRAIN_SRC=$(CURDIR) $(NO_USER_CONFIG) \
	    $(TEST_BIN) --jobs $${CT_TEST_JOBS:-2}

# The GPU conformance suite alone (suites named gpu_*): every op on the GPU against
# the CPU reference. Without a GPU each test reports itself skipped, with the reason.
test-gpu: setup
	@$(MAKE) --no-print-directory $(JOBS) $(SO) $(TEST_BIN) $(CLI_BIN) $(GPT_BIN) $(QUICK_BIN) $(GEN_BIN) $(LLAMA_BIN) $(FINETUNE_BIN)
	CTRAIN_BIN=$(abspath $(BUILD)/bin/ctrain) CTRAIN_EXAMPLES=$(abspath $(BUILD)/examples) \
	CTRAIN_LIB=$(abspath $(SO)) CTRAIN_SRC=$(CURDIR) $(NO_USER_CONFIG) \
	    $(TEST_BIN) --filter 'gpu_*/*' --jobs 1 --verbose

asan: setup
	@$(MAKE) --no-print-directory $(JOBS) BUILD=build-asan OPT=-O1 build-asan/tests/ctrain_tests build-asan/lib/libctrain.so \
	    $(if $(CLI_SRC),build-asan/bin/ctrain) build-asan/examples/gpt_train build-asan/examples/quickstart build-asan/examples/generate \
	    build-asan/examples/llama_train build-asan/examples/finetune \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
	CTRAIN_BIN=$(abspath build-asan/bin/ctrain) CTRAIN_EXAMPLES=$(abspath build-asan/examples) \
	CTRAIN_LIB=$(abspath build-asan/lib/libctrain.so) CTRAIN_SRC=$(CURDIR) CTRAIN_CONFIG_FILE=$(abspath build-asan)/tests/no-default-config.yaml \
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp) \
	    tests/run_checked.sh build-asan/tests.log build-asan/tests/ctrain_tests --jobs $${CT_TEST_JOBS:-2}

# valgrind over the lifetime tests: no definite or indirect leak, no invalid access.
memcheck: setup
	@$(MAKE) --no-print-directory $(JOBS) $(TEST_BIN)
	CT_MEMCHECK=1 tests/run_checked.sh $(BUILD)/memcheck.log \
	    valgrind -q --leak-check=full --errors-for-leak-kinds=definite,indirect \
	    --error-exitcode=3 --trace-children=yes $(TEST_BIN) --filter '@(frame|tensor|safetensors)/*' --jobs 1

# Each fuzz target links the library sources built with clang's libFuzzer + ASan/UBSan.
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -DCTRAIN_VERSION='"$(VERSION)"' -O1 -g -I. -fopenmp -fsanitize=fuzzer,address,undefined -Wall -Wextra -Werror -Wno-unknown-pragmas
fuzz: setup
	@mkdir -p $(BUILD)/fuzz
	@set -e; for f in $(FUZZ_SRC); do \
	    name=$$(basename $$f .c); \
	    echo "fuzz: building $$name"; \
	    clang $(FUZZ_CFLAGS) -o $(BUILD)/fuzz/$$name $$f $(LIB_SRC) $(LDLIBS); \
	    mkdir -p $(BUILD)/fuzz/$$name-corpus; \
	    seeds=fuzz/corpus/$$name; [ -d $$seeds ] || seeds=; \
	    echo "fuzz: running $$name for $(FUZZ_SECONDS) s"; \
	    $(BUILD)/fuzz/$$name -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        -artifact_prefix=$(BUILD)/fuzz/ $(BUILD)/fuzz/$$name-corpus $$seeds; \
	done

$(BUILD)/bench/%: bench/%.c $(AR_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(ALL_LDFLAGS) -o $@ $< $(AR_LIB) $(LDLIBS)

bench: setup
	@$(MAKE) --no-print-directory $(JOBS) $(BENCH_BIN)
	@set -e; for b in $(filter $(BUILD)/bench/kernels/%,$(BENCH_BIN)); do echo "== $$b"; $$b; done

# GPT and Llama training and generation throughput against PyTorch CPU (bench/gpt_cpu/run.sh; about 25 minutes on 2 cores).
bench-gpt: setup
	@$(MAKE) --no-print-directory $(JOBS) $(BENCH_BIN)
	bench/gpt_cpu/run.sh --out $(BUILD)/bench/gpt_cpu.md

# allreduce bus bandwidth: ctrain shm and tcp beside OpenMPI and gloo (bench/collectives/run.sh)
bench-collectives: setup
	bench/collectives/run.sh --out $(BUILD)/bench/collectives.md

# GPT W1 data-parallel training: ctrain DDP beside PyTorch DDP and HF Accelerate (bench/ddp/run.sh)
bench-ddp: setup
	bench/ddp/run.sh --out $(BUILD)/bench/ddp.md

# GPT training by sharding strategy: DDP, ZeRO-1/2/3, HYBRID; memory split, wire bytes (bench/strategies/run.sh: ctrain bench)
bench-strategies: setup
	bench/strategies/run.sh --out $(BUILD)/bench/strategies.md

# GPT-2 124M checkpoints: save_state / load_state beside Accelerate's and dd's rates (bench/checkpoint/run.sh)
bench-checkpoint: setup
	bench/checkpoint/run.sh --out $(BUILD)/bench/checkpoint.md

# GPT-2 124M training on one GPU beside PyTorch, and each kernel against the device's peak (bench/gpt_gpu/run.sh)
bench-gpu: setup
	bench/gpt_gpu/run.sh --out $(BUILD)/bench/gpt_gpu.md

# byte-level BPE encoding against Hugging Face tokenizers, one thread (bench/tokenizer/run.sh)
bench-tokenizer: setup
	bench/tokenizer/run.sh

# The README's main job: train the bundled GPT on its default data.
GPT_BIN := $(BUILD)/examples/gpt_train
TRAIN_ARGS ?=
# what the training examples share (examples/common/train_util.h)
EX_COMMON := examples/common/train_util.c
$(GPT_BIN): examples/gpt/train.c $(EX_COMMON) examples/common/train_util.h $(AR_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(ALL_LDFLAGS) -o $@ $< $(EX_COMMON) $(AR_LIB) $(LDLIBS)

# examples/quickstart.c: the four-call Accelerator conversion (docs/guide.md)
QUICK_BIN := $(BUILD)/examples/quickstart
$(QUICK_BIN): examples/quickstart.c $(AR_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(ALL_LDFLAGS) -o $@ $< $(AR_LIB) $(LDLIBS)

train: setup
	@$(MAKE) --no-print-directory $(JOBS) $(GPT_BIN)
	$(GPT_BIN) $(TRAIN_ARGS)

# examples/generate/generate.c: ct_lm_from_pretrained + ct_generate (docs/guide.md,
# "Generating text"); `make generate` continues PROMPT with the model `make train` saved
GEN_BIN := $(BUILD)/examples/generate
MODEL ?= $(BUILD)/gpt
PROMPT ?= The
$(GEN_BIN): examples/generate/generate.c $(AR_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(ALL_LDFLAGS) -o $@ $< $(AR_LIB) $(LDLIBS)

generate: setup
	@$(MAKE) --no-print-directory $(JOBS) $(GEN_BIN)
	$(GEN_BIN) '$(MODEL)' '$(PROMPT)'

# examples/llama/train.c: a small Llama with its own BPE tokenizer, pretrained on the
# fortunes; `make llama` runs it with its defaults (LLAMA_ARGS adds options)
LLAMA_BIN := $(BUILD)/examples/llama_train
LLAMA_ARGS ?=
$(LLAMA_BIN): examples/llama/train.c $(EX_COMMON) examples/common/train_util.h $(AR_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(ALL_LDFLAGS) -o $@ $< $(EX_COMMON) $(AR_LIB) $(LDLIBS)

llama: setup
	@$(MAKE) --no-print-directory $(JOBS) $(LLAMA_BIN)
	$(LLAMA_BIN) $(LLAMA_ARGS)

# examples/finetune/finetune.c: question/answer fine-tuning of a saved GPT-2 or Llama;
# `make finetune MODEL=DIR` tunes the model in DIR on the bundled sample pairs
FINETUNE_BIN := $(BUILD)/examples/finetune
FINETUNE_ARGS ?=
$(FINETUNE_BIN): examples/finetune/finetune.c $(EX_COMMON) examples/common/train_util.h $(AR_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(ALL_LDFLAGS) -o $@ $< $(EX_COMMON) $(AR_LIB) $(LDLIBS)

finetune: setup
	@$(MAKE) --no-print-directory $(JOBS) $(FINETUNE_BIN)
	$(FINETUNE_BIN) --model '$(MODEL)' $(FINETUNE_ARGS)

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include/ctrain
	$(if $(CLI_BIN),install -D -m 755 $(CLI_BIN) $(DESTDIR)$(PREFIX)/bin/ctrain)
	install -m 644 $(AR_LIB) $(DESTDIR)$(PREFIX)/lib/libctrain.a
	install -m 755 $(SO) $(DESTDIR)$(PREFIX)/lib/libctrain.so.$(VERSION)
	ln -sf libctrain.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libctrain.so.0
	ln -sf libctrain.so.0 $(DESTDIR)$(PREFIX)/lib/libctrain.so
	@for h in $(LIB_HDR); do install -D -m 644 $$h $(DESTDIR)$(PREFIX)/include/ctrain/$$h; done
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@CUDA_LIBS@|$(CUDA_LIBS)|' ctrain.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/ctrain.pc

uninstall:
	rm -rf $(DESTDIR)$(PREFIX)/include/ctrain $(DESTDIR)$(PREFIX)/lib/pkgconfig/ctrain.pc
	rm -f $(DESTDIR)$(PREFIX)/lib/libctrain.a $(DESTDIR)$(PREFIX)/lib/libctrain.so* $(DESTDIR)$(PREFIX)/bin/ctrain

# docs/api.md is generated from the public headers; run after changing one.
api-doc:
	python3 tools/api_doc.py > docs/api.md

clean:
	rm -rf build build-asan

-include $(LIB_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(GPT_BIN).d $(QUICK_BIN).d $(GEN_BIN).d
