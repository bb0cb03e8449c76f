# EMLIO - one non-recursive Makefile.
#   make            libemlio.a, libemlio.so, emliod, emlio
#   make test       every test; last line "N passed, N failed"
#   make check      make test under ASan + UBSan
#   make demo       install deps, build, synthesize, serve, fetch one epoch
#   make fuzz       libFuzzer targets (clang), FUZZ_SECONDS each
# Knobs: CC, DEBUG=1, SANITIZE=address,undefined, WERROR=1
SHELL := /bin/bash
CC ?= cc
B := build
PKG_CONFIG ?= pkg-config

MSGPACK_PC := $(shell $(PKG_CONFIG) --exists msgpack-c && echo msgpack-c || echo msgpack)
DEP_CFLAGS := $(shell $(PKG_CONFIG) --cflags libzmq $(MSGPACK_PC) 2>/dev/null)
DEP_LIBS := $(shell $(PKG_CONFIG) --libs libzmq $(MSGPACK_PC) 2>/dev/null) -lpthread -lm
JPEG_LIBS := $(shell $(PKG_CONFIG) --libs libturbojpeg 2>/dev/null || echo -lturbojpeg)

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wvla -Wwrite-strings -Wformat=2 -fno-common
OPT := -O2 -g
ifeq ($(DEBUG),1)
OPT := -O0 -g3
endif
SAN :=
ifneq ($(SANITIZE),)
SAN := -fsanitize=$(SANITIZE) -fno-sanitize-recover=all -fno-omit-frame-pointer
endif
ifeq ($(WERROR),1)
WARN += -Werror
endif

CFLAGS_ALL := -std=c11 $(OPT) $(WARN) $(SAN) -fPIC -fvisibility=hidden \
              -Iinclude -Isrc $(DEP_CFLAGS) $(CFLAGS)
LDFLAGS_ALL := $(SAN) $(LDFLAGS)

LIB_SRC := $(sort $(wildcard src/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(B)/obj/%.o)
EMLIOD_SRC := $(sort $(wildcard tools/emliod/*.c))
EMLIO_SRC := $(sort $(wildcard tools/emlio/*.c))
TOOL_OBJ := $(EMLIOD_SRC:%.c=$(B)/obj/%.o) $(EMLIO_SRC:%.c=$(B)/obj/%.o)
UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(B)/tests/%)
FUZZ_SRC := $(sort $(wildcard fuzz/fuzz_*.c))
FUZZ_REPLAY := $(FUZZ_SRC:fuzz/%.c=$(B)/fuzz/replay_%)
FUZZ_BIN := $(FUZZ_SRC:fuzz/%.c=$(B)/fuzz/%)

.PHONY: all test test-only check demo fuzz format format-check clean deps python
all: $(B)/libemlio.a $(B)/libemlio.so $(B)/bin/emliod $(B)/bin/emlio \
     $(B)/bench/delayline

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(B)/libemlio.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(B)/libemlio.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDFLAGS_ALL) $(DEP_LIBS)

$(B)/bin/emliod: $(EMLIOD_SRC:%.c=$(B)/obj/%.o) $(B)/libemlio.a
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL) $(DEP_LIBS)

$(B)/bin/emlio: $(EMLIO_SRC:%.c=$(B)/obj/%.o) $(B)/libemlio.a
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL) $(DEP_LIBS) $(JPEG_LIBS)

# The end-to-end RTT emulator of bench/run (TUN devices, network namespaces).
$(B)/bench/delayline: bench/delayline.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(OPT) $(WARN) $(SAN) -o $@ $< $(LDFLAGS_ALL) -lpthread

$(B)/tests/%: tests/unit/%.c $(B)/libemlio.a tests/emlio_test.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itests -o $@ $< $(B)/libemlio.a $(LDFLAGS_ALL) $(DEP_LIBS) -lcmocka

# Fuzz harnesses are replayed over their corpus and regressions with the
# ordinary compiler, so every `make test` re-runs past crashes.
$(B)/fuzz/replay_%: fuzz/%.c fuzz/replay.c $(B)/libemlio.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< fuzz/replay.c $(B)/libemlio.a $(LDFLAGS_ALL) $(DEP_LIBS)

# A stand-in NVML library, so the energy module's GPU path runs without GPUs.
$(B)/tests/libfake_nvml.so: tests/fake_nvml.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g -Wall -Wextra -shared -fPIC -o $@ $<

$(B)/tests/test_energy: $(B)/tests/libfake_nvml.so

# `make test` works on a fresh machine: it installs what is missing first
# (a no-op taking about a second when everything is there), then builds in
# a second make so pkg-config sees the new packages.
test:
	@scripts/install-deps.sh
	@$(MAKE) --no-print-directory test-only

test-only: all $(UNIT_BIN) $(FUZZ_REPLAY) $(B)/tests/libfake_nvml.so
	@tests/run.sh

# Python loads the sanitized libemlio.so, so the ASan/UBSan runtimes are
# preloaded into the interpreter (leak checking off there: CPython itself
# keeps memory to the end). The quarantine is kept small so memory-bound
# tests measure the daemon, not ASan's hold on freed blocks.
SAN_PRELOAD = $(shell $(CC) -print-file-name=libasan.so) $(shell $(CC) -print-file-name=libubsan.so)
check:
	ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:quarantine_size_mb=32 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	EMLIO_PY_PRELOAD="$(SAN_PRELOAD)" EMLIO_SANITIZED=1 \
	$(MAKE) B=build-san SANITIZE=address,undefined DEBUG=1 test-only

FUZZ_SECONDS ?= 60
FUZZ_CFLAGS := -std=c11 -O1 -g -fsanitize=fuzzer,address,undefined -Iinclude -Isrc $(DEP_CFLAGS)
FUZZ_LIB_SRC := $(LIB_SRC)
$(B)/fuzz/fuzz_%: fuzz/fuzz_%.c $(LIB_SRC)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_LIB_SRC) $(DEP_LIBS)

fuzz: $(FUZZ_BIN)
	@for f in $(FUZZ_BIN); do \
	    t=$$(basename $$f); t=$${t#fuzz_}; \
	    mkdir -p $(B)/fuzz/corpus-$$t; \
	    echo "fuzz: $$t for $(FUZZ_SECONDS)s"; \
	    $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        -artifact_prefix=$(B)/fuzz/crash-$$t- \
	        $(B)/fuzz/corpus-$$t fuzz/corpus/$$t 2>&1 | grep -E 'stat::number_of_executed_units|ERROR|SUMMARY' ; \
	    test $${PIPESTATUS[0]} -eq 0 || exit 1; \
	done

deps:
	@scripts/install-deps.sh

# The demo needs only the build packages (and python3 for its summary);
# `make deps` or .ci/run installs the full test and benchmark set.
demo:
	@EMLIO_DEPS_MINIMAL=1 scripts/install-deps.sh
	@$(MAKE) --no-print-directory all
	@scripts/demo.sh

FORMAT_FILES = $(shell git ls-files '*.c' '*.h' 2>/dev/null)
format:
	clang-format -i $(FORMAT_FILES)

format-check:
	clang-format --dry-run -Werror $(FORMAT_FILES)

clean:
	rm -rf $(B) build-san

-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)
