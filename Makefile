# pi2 — build everything into build/.
#   make          build libraries, tools and tests
#   make test     run the test suite (ends with "N passed, N failed, N skipped")
#   make asan     the test suite under AddressSanitizer + UBSan (in build-asan/)
#   make fuzz     libFuzzer on every decoder of outside bytes, FUZZ_SECONDS each (clang, build-fuzz/)
#   make demo     tell a story with the built-in stories260K model
#   make deps     install the Debian packages the project needs (apt-get, root)

BUILD    ?= build
CC       ?= gcc
OPT      ?= -O2
CFLAGS   ?= $(OPT) -g
CFLAGS   += -std=c11 -D_GNU_SOURCE -Wall -Wextra -pthread -Ilib -MMD -MP $(SAN)
LDFLAGS  += -pthread $(SAN)
LDLIBS   += -lzmq -lprotobuf-c -luring -lm
CFLAGS   += -I$(BUILD)/proto

DEB_PACKAGES := gcc make libzmq3-dev libprotobuf-c-dev protobuf-c-compiler liburing-dev pkg-config clang libclang-rt-dev \
                linux-perf util-linux procps

PROTO_SRC := $(wildcard proto/*.proto)
PROTO_C   := $(PROTO_SRC:proto/%.proto=$(BUILD)/proto/%.pb-c.c)
LIB_SRC   := $(wildcard lib/*.c lib/*/*.c)
TOOL_SRC  := $(wildcard tools/*.c)
# each process folder's *.c files make one program: build/bin/<folder>
PROC_DIRS := coordinator npu-worker cpu-worker io-worker cachemgr planner
PROC_SRC  := $(foreach d,$(PROC_DIRS),$(wildcard $(d)/*.c))
PROCS     := $(foreach d,$(PROC_DIRS),$(if $(wildcard $(d)/*.c),$(BUILD)/bin/$(d)))
SCRIPTS   := $(patsubst scripts/%.sh,$(BUILD)/bin/%,$(wildcard scripts/pi2.sh))
TEST_SRC  := $(wildcard tests/test_*.c)
TESTLIB_SRC := $(filter-out $(TEST_SRC),$(wildcard tests/*.c))

LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o) $(PROTO_C:%.c=%.o)
TESTLIB_OBJ := $(TESTLIB_SRC:%.c=$(BUILD)/%.o)
TOOLS     := $(TOOL_SRC:tools/%.c=$(BUILD)/bin/%)
TESTS     := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
LIBPI2    := $(BUILD)/libpi2.a

# SIMD kernels are compiled per file for their ISA and chosen at run time.
# Any lib/**/*_avx2.c / *_avx512.c / *_amx.c file gets its ISA's flags.
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c
$(BUILD)/lib/%_avx2.o:   CFLAGS += -mavx2 -mfma -mf16c
$(BUILD)/lib/%_avx512.o: CFLAGS += $(AVX512_FLAGS)
$(BUILD)/lib/%_amx.o:    CFLAGS += $(AVX512_FLAGS) -mamx-tile -mamx-int8

.PHONY: all test asan fuzz demo deps check-deps clean bench
.SECONDARY:
all: check-deps $(LIBPI2) $(TOOLS) $(PROCS) $(SCRIPTS) $(TESTS)

check-deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "make: installing missing Debian packages:$$missing" >&2; \
	    $(MAKE) --no-print-directory deps || exit 1; \
	  else echo "make: missing Debian packages:$$missing (run 'make deps' as root)" >&2; \
	    [ -n "$$PI2_IGNORE_DEPS" ] || exit 1; fi; fi

deps:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEB_PACKAGES)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# protobuf-c sources are generated into the build tree; every object may include them.
# (after check-deps: on a fresh machine protoc-c arrives with the packages)
$(BUILD)/proto/%.pb-c.c $(BUILD)/proto/%.pb-c.h: proto/%.proto | check-deps
	@mkdir -p $(dir $@)
	protoc-c --proto_path=proto --c_out=$(BUILD)/proto $<

$(BUILD)/proto/%.pb-c.o: $(BUILD)/proto/%.pb-c.c
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB_OBJ) $(TESTLIB_OBJ) $(TOOL_SRC:tools/%.c=$(BUILD)/tools/%.o) $(TEST_SRC:tests/%.c=$(BUILD)/tests/%.o) \
  $(PROC_SRC:%.c=$(BUILD)/%.o): | $(PROTO_C)

$(LIBPI2): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/bin/%: $(BUILD)/tools/%.o $(LIBPI2)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

define PROC_RULE
$(BUILD)/bin/$(1): $(patsubst %.c,$(BUILD)/%.o,$(wildcard $(1)/*.c)) $(LIBPI2)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(LDFLAGS) $$^ $$(LDLIBS) -o $$@
endef
$(foreach d,$(PROC_DIRS),$(if $(wildcard $(d)/*.c),$(eval $(call PROC_RULE,$(d)))))

# the supervisor script, on the PATH of the build
$(BUILD)/bin/%: scripts/%.sh
	@mkdir -p $(dir $@)
	cp $< $@ && chmod +x $@

# each process's pieces but its main, for the tests of them: build/<folder>.a
PROC_ARCHIVES := $(foreach d,$(PROC_DIRS),$(if $(filter-out $(d)/main.c,$(wildcard $(d)/*.c)),$(BUILD)/$(d).a))
define PROC_ARCHIVE_RULE
$(BUILD)/$(1).a: $(patsubst %.c,$(BUILD)/%.o,$(filter-out $(1)/main.c,$(wildcard $(1)/*.c)))
	@rm -f $$@
	ar rcs $$@ $$^
endef
$(foreach d,$(PROC_DIRS),$(eval $(call PROC_ARCHIVE_RULE,$(d))))

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(TESTLIB_OBJ) $(PROC_ARCHIVES) $(LIBPI2)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

test: all
	@BUILD=$(BUILD) tests/run.sh

asan:
	@$(MAKE) --no-print-directory BUILD=build-asan OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

# libFuzzer harnesses (tests/fuzz/), each run for FUZZ_SECONDS (clang, into build-fuzz/)
FUZZ_SECONDS ?= 60
fuzz: all
	@BUILD=$(BUILD) tests/fuzz/run.sh $(FUZZ_SECONDS)

demo: all
	@scripts/demo.sh $(BUILD)

bench: all
	@echo "benchmarks: see bench/ (e.g. bench/ref-decode)"

clean:
	rm -rf build build-asan build-fuzz

-include $(PROC_SRC:%.c=$(BUILD)/%.d) $(LIB_OBJ:.o=.d) $(TESTLIB_OBJ:.o=.d) $(TOOL_SRC:tools/%.c=$(BUILD)/tools/%.d) $(TEST_SRC:tests/%.c=$(BUILD)/tests/%.d)
