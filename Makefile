# EMLIO - one non-recursive Makefile.
#   make            libemlio.a, libemlio.so.ABI, emliod, emlio, man pages,
#                   libemlio.pc, and the benchmark relay (build/bin/emlio-relay)
#   make install    into $(DESTDIR)$(PREFIX) (PREFIX=/usr/local); make uninstall
#   make test       every test; last line "N passed, N failed"
#   make check      make test under ASan + UBSan
#   make demo       install deps, build, synthesize, serve, fetch one epoch
#   make fuzz       libFuzzer targets (clang), FUZZ_SECONDS each
# Knobs: CC, DEBUG=1, SANITIZE=address,undefined, WERROR=1, B=build dir
SHELL := /bin/bash
CC ?= cc
B := build
PKG_CONFIG ?= pkg-config

# VERSION is the single source of the version: the library (emlio/version.h),
# its SONAME, libemlio.pc, the man pages, the Python package and --version.
VERSION := $(shell cat VERSION)
VERSION_MAJOR := $(word 1,$(subst ., ,$(VERSION)))
VERSION_MINOR := $(word 2,$(subst ., ,$(VERSION)))
VERSION_PATCH := $(word 3,$(subst ., ,$(VERSION)))
# The ABI's version: MAJOR, or 0.MINOR while MAJOR is 0, where every minor
# release may change the ABI (0.2 renamed functions and grew structs), so
# a program built against 0.1 is refused at load time, not run wrong.
ABI := $(if $(filter 0,$(VERSION_MAJOR)),0.$(VERSION_MINOR),$(VERSION_MAJOR))
SONAME := libemlio.so.$(ABI)

PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
DATADIR ?= $(PREFIX)/share
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system

MSGPACK_PC := $(shell $(PKG_CONFIG) --exists msgpack-c && echo msgpack-c || echo msgpack)
DEP_CFLAGS := $(shell $(PKG_CONFIG) --cflags libzmq $(MSGPACK_PC) 2>/dev/null)
DEP_LIBS := $(shell $(PKG_CONFIG) --libs libzmq $(MSGPACK_PC) 2>/dev/null) -ljpeg -lpng -lpthread -lm
# io_uring for cold reads (src/store/ioengine.c) when liburing is there;
# without it the engine reads with pread.
URING_OK := $(shell $(PKG_CONFIG) --exists liburing && echo 1)
ifeq ($(URING_OK),1)
DEP_CFLAGS += -DEMLIO_HAVE_URING $(shell $(PKG_CONFIG) --cflags liburing)
DEP_LIBS += $(shell $(PKG_CONFIG) --libs liburing)
endif
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

# Subsystems live in folders (src/store/, ...); each folder's face headers
# are on the include path of the library, its tests and fuzzers.
SUBSYS_DIRS := $(sort $(dir $(wildcard src/*/*.c)))
SUBSYS_INC := $(patsubst %/,-I%,$(SUBSYS_DIRS))
BASE_CFLAGS := -std=c11 $(OPT) $(WARN) $(SAN) -Iinclude -I$(B)/include
# The library: private headers, ZeroMQ and msgpack, only exports marked.
CFLAGS_ALL := $(BASE_CFLAGS) -fPIC -fvisibility=hidden -Isrc $(SUBSYS_INC) $(DEP_CFLAGS) \
              $(CFLAGS)
# The programs see the installed headers only (no src/, no zmq.h).
TOOL_CFLAGS := $(BASE_CFLAGS) -Itools/common $(CFLAGS)
LDFLAGS_ALL := $(SAN) $(LDFLAGS)
# Programs find libemlio.so next to them: build/lib from build/bin, and
# PREFIX/lib from PREFIX/bin once installed.
TOOL_LIBS := -L$(B)/lib -lemlio -Wl,-rpath,'$$ORIGIN/../lib'

VERSION_H := $(B)/include/emlio/version.h
LIB_SRC := $(sort $(wildcard src/*.c src/*/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(B)/obj/%.o)
LIB_REAL := $(B)/lib/libemlio.so.$(VERSION)
LIB_LINKS := $(B)/lib/$(SONAME) $(B)/lib/libemlio.so $(B)/libemlio.so
# Modules only the programs link (exporters, option parsing): training
# processes that load libemlio.so never map them.
COMMON_SRC := $(sort $(wildcard tools/common/*.c))
COMMON_OBJ := $(COMMON_SRC:%.c=$(B)/tobj/%.o)
EMLIOD_SRC := $(sort $(wildcard tools/emliod/*.c))
EMLIO_SRC := $(sort $(wildcard tools/emlio/*.c))
RELAY_SRC := $(sort $(wildcard bench/relay/*.c))
TOOL_OBJ := $(EMLIOD_SRC:%.c=$(B)/tobj/%.o) $(EMLIO_SRC:%.c=$(B)/tobj/%.o) \
            $(RELAY_SRC:%.c=$(B)/tobj/%.o) $(COMMON_OBJ)
UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(B)/tests/%)
FUZZ_SRC := $(sort $(wildcard fuzz/fuzz_*.c))
FUZZ_REPLAY := $(FUZZ_SRC:fuzz/%.c=$(B)/fuzz/replay_%)
FUZZ_BIN := $(FUZZ_SRC:fuzz/%.c=$(B)/fuzz/%)
MAN_SRC := $(sort $(wildcard man/*.[0-9].in))
MAN_OUT := $(MAN_SRC:man/%.in=$(B)/man/%)

.PHONY: all hooks test test-only check demo fuzz format format-check clean deps \
        python install uninstall
all: $(B)/libemlio.a $(LIB_REAL) $(LIB_LINKS) $(B)/bin/emliod $(B)/bin/emlio \
     $(B)/bin/emlio-relay $(B)/libemlio.pc $(MAN_OUT) \
     $(B)/bench/delayline $(B)/bench/transform_bench $(B)/bench/folder_tree \
     $(B)/bench/start_scale $(B)/bench/crc_speed hooks

# The commit-message rule (scripts/commit-msg) as this clone's hook; a
# tree that is not a git clone (a release tarball) has none to install.
hooks:
	@h=$$(git rev-parse --git-path hooks 2>/dev/null) && mkdir -p "$$h" && \
	    { cmp -s scripts/commit-msg "$$h/commit-msg" || \
	      install -m 755 scripts/commit-msg "$$h/commit-msg"; } || true

$(VERSION_H): VERSION
	@mkdir -p $(dir $@)
	@printf '%s\n' \
	    '/* emlio/version.h - generated from VERSION by the Makefile. */' \
	    '#ifndef EMLIO_VERSION_H' '#define EMLIO_VERSION_H' \
	    '#define EMLIO_VERSION_MAJOR $(VERSION_MAJOR)' \
	    '#define EMLIO_VERSION_MINOR $(VERSION_MINOR)' \
	    '#define EMLIO_VERSION_PATCH $(VERSION_PATCH)' \
	    '#define EMLIO_VERSION_STRING "$(VERSION)"' \
	    '#endif /* EMLIO_VERSION_H */' >$@

$(LIB_OBJ) $(TOOL_OBJ): | $(VERSION_H)

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(B)/tobj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(TOOL_CFLAGS) -MMD -MP -c $< -o $@

$(B)/libemlio.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIB_REAL): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(LDFLAGS_ALL) $(DEP_LIBS)

# The links follow VERSION: after a bump, a build tree's old links would
# point the programs' link at the old SONAME.
$(B)/lib/$(SONAME): VERSION | $(LIB_REAL)
	ln -sfn libemlio.so.$(VERSION) $@
$(B)/lib/libemlio.so: VERSION | $(B)/lib/$(SONAME)
	ln -sfn $(SONAME) $@
# The build tree's old path, used by the Python tests and bench/.
$(B)/libemlio.so: VERSION | $(LIB_REAL)
	ln -sfn lib/libemlio.so.$(VERSION) $@

$(B)/libemlio-common.a: $(COMMON_OBJ)
	rm -f $@ && ar rcs $@ $^

$(B)/bin/emliod: $(EMLIOD_SRC:%.c=$(B)/tobj/%.o) $(B)/libemlio-common.a $(LIB_REAL) | $(LIB_LINKS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $(filter %.o %.a,$^) $(LDFLAGS_ALL) $(TOOL_LIBS) -lpthread -lm

$(B)/bin/emlio: $(EMLIO_SRC:%.c=$(B)/tobj/%.o) $(B)/libemlio-common.a $(LIB_REAL) | $(LIB_LINKS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $(filter %.o %.a,$^) $(LDFLAGS_ALL) $(TOOL_LIBS) $(JPEG_LIBS) -lm

# The end-to-end RTT emulator of bench/run (TUN devices, network namespaces).
$(B)/bench/delayline: bench/delayline.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(OPT) $(WARN) $(SAN) -o $@ $< $(LDFLAGS_ALL) -lpthread

# The transform pipeline alone against a full libjpeg decode (bench/
# transform_bench.py runs it next to torchvision): built, never installed.
$(B)/bench/transform_bench: bench/transform_bench.c $(LIB_REAL) | $(LIB_LINKS)
	@mkdir -p $(dir $@)
	$(CC) $(TOOL_CFLAGS) -o $@ $< $(LDFLAGS_ALL) -L$(B)/lib -lemlio \
	    -Wl,-rpath,'$$ORIGIN/../lib' -ljpeg

# ImageFolder trees of tiny files for the start-up benchmark
# (bench/folder_start.sh) and the suite's scale test: built, never installed.
$(B)/bench/folder_tree: bench/folder_tree.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(OPT) $(WARN) $(SAN) -o $@ $< $(LDFLAGS_ALL)

# emliod's start at 10^7-10^8 samples (hard links of one shard): first,
# cached and cold-cache starts; built, never installed.
$(B)/bench/start_scale: bench/start_scale.c $(LIB_REAL) $(B)/bin/emliod | $(LIB_LINKS)
	@mkdir -p $(dir $@)
	$(CC) $(TOOL_CFLAGS) -o $@ $< $(LDFLAGS_ALL) -L$(B)/lib -lemlio \
	    -Wl,-rpath,'$$ORIGIN/../lib'

# CRC-32C speed per sample size, cached and from memory (the function is
# internal, so it links the static library): built, never installed.
$(B)/bench/crc_speed: bench/crc_speed.c $(B)/libemlio.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(OPT) $(WARN) $(SAN) -Isrc $(SUBSYS_INC) -Iinclude -I$(B)/include -o $@ $< \
	    $(B)/libemlio.a -lpthread

# A benchmark tool, not part of the product: built, never installed.
$(B)/bin/emlio-relay: $(RELAY_SRC:%.c=$(B)/tobj/%.o) $(B)/tobj/tools/common/tool_util.o
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDFLAGS_ALL) -lm

# libemlio.pc for PREFIX; `make install` writes it again for the PREFIX
# given then. The public headers need no dependency's flags, so only the
# libraries of a static link are listed (Libs.private): those of libzmq's
# and msgpack's own static links too (libzmq is C++ and needs libstdc++,
# libsodium, ...), as plain flags rather than Requires.private, which would
# add their include paths to every --cflags. Debian's libzmq.pc lists a
# bare "libprotokit.a", which no link can find, so only flags are kept.
PC_LIBS_PRIVATE := $(strip $(filter -%,$(shell $(PKG_CONFIG) --static --libs \
                   libzmq $(MSGPACK_PC) 2>/dev/null)) -ljpeg -lpng $(if $(URING_OK),-luring) -lpthread -lm)
# A library outside the linker's default directories is found at run time
# through RUNPATH, so programs built with `pkg-config --libs` run without
# LD_LIBRARY_PATH (docs/install.md).
PC_RPATH := $(if $(filter /usr/lib /usr/lib64 /usr/lib/% /lib /lib64 /lib/%,\
            $(LIBDIR)),,-Wl,-rpath,$${libdir})
define PC_TEXT
prefix=$(PREFIX)
exec_prefix=$${prefix}
libdir=$(patsubst $(PREFIX)%,$${exec_prefix}%,$(LIBDIR))
includedir=$(patsubst $(PREFIX)%,$${prefix}%,$(INCLUDEDIR))

Name: libemlio
Description: EMLIO data loading: daemon, client, planner, TFRecord
Version: $(VERSION)
Libs: $(strip -L$${libdir} $(PC_RPATH) -lemlio)
Libs.private: $(PC_LIBS_PRIVATE)
Cflags: -I$${includedir}
endef
export PC_TEXT

$(B)/libemlio.pc: VERSION Makefile
	@mkdir -p $(dir $@)
	@printf '%s\n' "$$PC_TEXT" >$@

$(B)/man/%: man/%.in VERSION
	@mkdir -p $(dir $@)
	sed 's/@VERSION@/$(VERSION)/g' $< >$@

$(B)/tests/%: tests/unit/%.c $(B)/libemlio.a $(B)/libemlio-common.a tests/emlio_test.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itests -Itools/common -o $@ $< $(B)/libemlio-common.a $(B)/libemlio.a $(LDFLAGS_ALL) $(DEP_LIBS) -lcmocka

# Fuzz harnesses are replayed over their corpus and regressions with the
# ordinary compiler, so every `make test` re-runs past crashes.
$(B)/fuzz/replay_%: fuzz/%.c fuzz/replay.c $(B)/libemlio.a $(B)/libemlio-common.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itools/common -o $@ $< fuzz/replay.c $(B)/libemlio-common.a $(B)/libemlio.a $(LDFLAGS_ALL) $(DEP_LIBS)

# make install: the library (SONAME link, development link, archive), the
# headers, libemlio.pc, both programs, the man pages and the systemd unit.
INSTALL_HEADERS := $(sort $(wildcard include/emlio/*.h)) $(VERSION_H)
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR) \
	    $(DESTDIR)$(INCLUDEDIR)/emlio $(DESTDIR)$(MANDIR)/man1 \
	    $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(SYSTEMDUNITDIR) \
	    $(DESTDIR)$(DATADIR)/emlio
	install -m 755 $(B)/bin/emliod $(B)/bin/emlio $(DESTDIR)$(BINDIR)/
	install -m 755 $(LIB_REAL) $(DESTDIR)$(LIBDIR)/
	ln -sfn libemlio.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sfn $(SONAME) $(DESTDIR)$(LIBDIR)/libemlio.so
	install -m 644 $(B)/libemlio.a $(DESTDIR)$(LIBDIR)/
	printf '%s\n' "$$PC_TEXT" >$(DESTDIR)$(PKGCONFIGDIR)/libemlio.pc
	install -m 644 include/emlio.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 644 $(INSTALL_HEADERS) $(DESTDIR)$(INCLUDEDIR)/emlio/
	install -m 644 $(filter %.1,$(MAN_OUT)) $(DESTDIR)$(MANDIR)/man1/
	install -m 644 $(filter %.8,$(MAN_OUT)) $(DESTDIR)$(MANDIR)/man8/
	sed 's|@BINDIR@|$(BINDIR)|g' dist/emliod@.service >$(DESTDIR)$(SYSTEMDUNITDIR)/emliod@.service
	chmod 644 $(DESTDIR)$(SYSTEMDUNITDIR)/emliod@.service
	install -m 644 dist/emliod.conf.example $(DESTDIR)$(DATADIR)/emlio/
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then ldconfig; fi

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/emliod $(DESTDIR)$(BINDIR)/emlio \
	    $(DESTDIR)$(LIBDIR)/libemlio.so.$(VERSION) \
	    $(DESTDIR)$(LIBDIR)/$(SONAME) $(DESTDIR)$(LIBDIR)/libemlio.so \
	    $(DESTDIR)$(LIBDIR)/libemlio.a $(DESTDIR)$(PKGCONFIGDIR)/libemlio.pc \
	    $(DESTDIR)$(INCLUDEDIR)/emlio.h \
	    $(addprefix $(DESTDIR)$(INCLUDEDIR)/emlio/,$(notdir $(INSTALL_HEADERS))) \
	    $(addprefix $(DESTDIR)$(MANDIR)/man1/,$(notdir $(filter %.1,$(MAN_OUT)))) \
	    $(addprefix $(DESTDIR)$(MANDIR)/man8/,$(notdir $(filter %.8,$(MAN_OUT)))) \
	    $(DESTDIR)$(SYSTEMDUNITDIR)/emliod@.service \
	    $(DESTDIR)$(DATADIR)/emlio/emliod.conf.example
	-rmdir $(DESTDIR)$(INCLUDEDIR)/emlio $(DESTDIR)$(DATADIR)/emlio 2>/dev/null
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then ldconfig; fi

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
FUZZ_CFLAGS := -std=c11 -O1 -g -fsanitize=fuzzer,address,undefined -Iinclude \
               -I$(B)/include -Isrc $(SUBSYS_INC) -Itools/common $(DEP_CFLAGS)
FUZZ_LIB_SRC := $(LIB_SRC) $(COMMON_SRC)
$(B)/fuzz/fuzz_%: fuzz/fuzz_%.c $(LIB_SRC) | $(VERSION_H)
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

-include $(shell find $(B)/obj $(B)/tobj -name '*.d' 2>/dev/null)
