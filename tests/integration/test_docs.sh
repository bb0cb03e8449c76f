#!/usr/bin/env bash
# test_docs.sh - the manual does not drift from the code. The option
# tables (tools/common/opts.c) are the truth, read back through each
# command's --help; then:
#   - every option a --help text names exists (in it, or in the program it
#     refers to);
#   - emlio(1) names every option of each command in that command's section
#     and no option that does not exist; emliod(8)'s OPTIONS names exactly
#     emliod's options;
#   - an option the README or a man page's examples give to `emlio CMD` or
#     `emliod` exists there, and any other option the README names exists
#     in some command;
#   - `--format K` and `--to K` anywhere in the manual name file kinds the
#     code takes, and emliod's help and man page name every kind it serves;
#   - every public header is named in the README, and every header the
#     README names exists.
# Run from the repo root with B=<build dir>.
set -u
. tests/integration/lib.sh

CMDS="synth pack index inspect fetch plan keygen energy"
for c in $CMDS; do
    "$EMLIO" "$c" --help >"$T/help.$c" 2>&1
    check "emlio $c --help exits 0" test $? -eq 0
done
"$EMLIOD" --help >"$T/help.emliod" 2>&1
check "emliod --help exits 0" test $? -eq 0
# The file kinds, as the code states them in its refusals.
mkdir -p "$T/nodata"
"$EMLIOD" --data "$T/nodata" --bind 'tcp://127.0.0.1:*' --format bogus 2>&1 |
    sed -n "s/.*unknown format 'bogus' (\(.*\)).*/\1/p" | tr -s ', ' '\n\n' |
    grep -v '^or$' >"$T/kinds.serve"
"$EMLIO" pack "$T/nodata" "$T/nodst" --to bogus 2>&1 |
    sed -n "s/.*expected \(.*\)/\1/p" | tr -s ', ' '\n\n' >"$T/kinds.pack"
check "emliod and pack name their file kinds" \
    bash -c "[ \$(wc -l <'$T/kinds.serve') -ge 3 ] && [ \$(wc -l <'$T/kinds.pack') -ge 2 ]"

/usr/bin/python3 - "$T" "$CMDS" >"$T/drift.txt" 2>&1 <<'EOF'
import glob, os, re, sys

tmp, cmds = sys.argv[1], sys.argv[2].split() + ["emliod"]
OPT = r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)"
problems = []

def options(text):
    """The options a --help defines: the option lines of its tables."""
    found = set()
    for line in text.splitlines():
        m = re.match(r"^  (?:-\w, )?--([a-z0-9-]+)", line)
        if m:
            found.add(m.group(1))
    return found

helps = {c: open(os.path.join(tmp, "help." + c)).read() for c in cmds}
table = {c: options(helps[c]) for c in cmds}
every = set().union(*table.values())

# 1. --help names only options that exist (its own, or another program's
# it refers to, as keygen's help names emliod's --authorized-keys).
for c in cmds:
    for name in set(re.findall(OPT, helps[c])) - every:
        problems.append(f"{c} --help names --{name}, which no command has")

def roff(text):
    return text.replace("\\-", "-").replace("\\e", "\\")

# 2. emlio(1): each command's section against its table, both ways.
man1 = roff(open("man/emlio.1.in").read())
sections = re.split(r'^\.SS "emlio (\w+)[^"]*"\n', man1, flags=re.M)
seen_cmds = set()
for i in range(1, len(sections), 2):
    c, body = sections[i], sections[i + 1].split("\n.SH ")[0]
    head = re.search(r'^\.SS "emlio ' + c + r'([^"]*)"', man1, re.M).group(1)
    seen_cmds.add(c)
    if c not in table:
        problems.append(f"emlio(1) documents a command 'emlio {c}' that does not exist")
        continue
    named = set(re.findall(OPT, head + body))
    for name in named - every:
        problems.append(f"emlio(1) names --{name} under 'emlio {c}'; no command has it")
    for name in table[c] - named - {"help"}:
        problems.append(f"emlio(1) does not document 'emlio {c} --{name}'")
for c in set(cmds) - seen_cmds - {"emliod"}:
    problems.append(f"emlio(1) has no section for 'emlio {c}'")

# 3. emliod(8): the OPTIONS section against emliod's table, both ways.
man8 = roff(open("man/emliod.8.in").read())
opts8 = re.search(r"^\.SH OPTIONS\n(.*?)^\.SH ", man8, re.M | re.S).group(1)
named = set(re.findall(OPT, opts8))
for name in named - table["emliod"]:
    problems.append(f"emliod(8) names --{name}, which emliod lacks")
for name in table["emliod"] - named - {"help"}:
    problems.append(f"emliod(8) does not document --{name}")

# 4. Command lines in the README and the man pages' other text: an option
# after `emlio CMD` or `emliod` belongs to that command. In the README any
# other --option must exist somewhere (lines about other programs aside).
def command_lines(text, where, loose):
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        if re.search(r"pkg-config|pip |python3? -m|cmake|git |systemctl", line):
            continue
        pos = 0
        for m in re.finditer(r"\bemlio(d)?\b(?:\s+(\w+))?", line):
            c = "emliod" if m.group(1) else m.group(2)
            if c not in table:
                continue
            rest = line[m.end():]
            stop = re.search(r"[|`;#]|\bemlio", rest)
            seg = rest[: stop.start()] if stop else rest
            for name in re.findall(OPT, seg):
                if name not in table[c]:
                    problems.append(f"{where}: '{c}' given --{name}, which it lacks: {line.strip()[:90]}")
        if loose:
            for name in re.findall(OPT, line):
                if name not in every:
                    problems.append(f"{where} names --{name}, which no command has: {line.strip()[:90]}")

readme = open("README.md").read()
command_lines(readme, "README.md", True)
command_lines(man1.split("\n.SH EXAMPLES")[1], "emlio(1) EXAMPLES", False)
command_lines(man8.split("\n.SH EXAMPLES")[1], "emliod(8) EXAMPLES", False)

# 5. File kinds: `--format K` (emliod) and `--to K` (pack) name kinds the
# code accepts, in the README, the man pages, docs/ and the --help texts;
# emliod's --help and man page name every kind it serves.
serve = set(open(os.path.join(tmp, "kinds.serve")).read().split())
pack = set(open(os.path.join(tmp, "kinds.pack")).read().split())
texts = {"README.md": readme, "emlio(1)": man1, "emliod(8)": man8}
texts.update({f: open(f).read() for f in glob.glob("docs/*.md")})
texts.update({c + " --help": helps[c] for c in cmds})
for where, text in texts.items():
    for opt, kinds in (("format", serve), ("to", pack)):
        for value in re.findall(r"--" + opt + r"[ =]([a-z|]+)", text):
            for k in value.split("|"):
                if k not in kinds:
                    problems.append(f"{where}: --{opt} {k} is not a file kind it takes ({', '.join(sorted(kinds))})")
for where, text in (("emliod --help", helps["emliod"]), ("emliod(8)", man8)):
    for k in serve - {"auto"}:
        if not re.search(k, text, re.I):
            problems.append(f"{where} does not name the file kind {k}")

# 6. Headers: the README's list and include/emlio/ agree.
public = {os.path.basename(h) for h in glob.glob("include/emlio/*.h")}
named_h = set(re.findall(r"`(?:emlio/)?([a-z_]+\.h)`", readme))
for h in public - named_h:
    problems.append(f"README.md does not name the public header {h}")
for h in named_h - public - {"emlio.h"}:
    problems.append(f"README.md names a header {h} that is not in include/")

for p in problems:
    print(p)
print(f"{len(problems)} drift problems")
sys.exit(1 if problems else 0)
EOF
rc=$?
[ $rc -eq 0 ] || cat "$T/drift.txt"
check "help, man pages and README agree with the option tables and headers" test $rc -eq 0

# Every environment variable a program reads is in its man page.
for pair in emlio:tools/emlio emliod:tools/emliod; do
    prog=${pair%%:*}
    man=man/$prog.$([ "$prog" = emlio ] && echo 1 || echo 8).in
    for v in $(grep -ho 'getenv("[A-Z_]*")' "${pair#*:}"/*.c | sed 's/getenv("\(.*\)")/\1/' | sort -u); do
        check "$man documents \$$v" grep -qw "$v" "$man"
    done
done
# The README's bare `emlio`/`emliod` commands say where make puts them,
# and that is where they are (issue 34: after `make demo` they were only in
# build/bin, unsaid).
check "README's 'Using it' says the programs are in build/bin" \
    bash -c "sed -n '/^## Using it/,/^\`\`\`sh/p' README.md | grep -q 'PATH=\\\$PWD/build/bin'"
check "  and make builds them there (B := build, \$(B)/bin/emlio)" \
    bash -c "grep -qx 'B := build' Makefile && grep -q '^\$(B)/bin/emlio:' Makefile"
# The README's word on the test summary and on running one test holds
# (issue 34: it promised a last line a failing run did not end with, and
# said nothing of running one test).
check "README's summary line is what tests/run.sh prints last" \
    bash -c "grep -qF '\"N passed, N failed, N skipped\"' README.md &&
             tail -2 tests/run.sh | grep -qF 'echo \"\$passed passed, \$failed failed, \$skipped skipped\"'"
one_test=$(tr '\n' ' ' <README.md | grep -o 'One test alone, after `make all`: `[^`]*`' | sed 's/.*: `//; s/`$//')
check "README names a command that runs one unit test ($one_test)" \
    test -n "$one_test"
# It builds a make target and runs what it built (make's default B is
# build); the binary, in this run's build directory, passes.
unit=$(printf '%s' "$one_test" | sed -n 's|^make build/tests/\(test_[a-z_]*\) && build/tests/\1$|\1|p')
check "  a make target it then runs: build/tests/TEST ($unit)" test -n "$unit"
# As a user runs it: without tests/run.sh's TAP output.
check "  which is a unit test that passes" \
    bash -c "[ -n '$unit' ] && env -u CMOCKA_MESSAGE_OUTPUT '$B/tests/$unit' >'$T/one.out' 2>&1 &&
             tail -1 '$T/one.out' | grep -q PASSED"
# Every format, not TFRecord only, in the README's opening and emlio(1).
check "README's opening names the three formats" \
    bash -c "sed -n '1,/^## /p' README.md | tr '\n' ' ' | grep -q 'TFRecord, WebDataset tar or ImageFolder'"
check "emlio(1) does not call its datasets TFRecord only" \
    bash -c "! grep -qi 'TFRecord datasets' man/emlio.1.in README.md"
# What emliod serves, in its own words: every format, not *.tfrecord only.
for f in "$T/help.emliod" man/emliod.8.in include/emlio/server.h; do
    check "${f#"$T"/} names the tar and ImageFolder formats" \
        bash -c "grep -q 'tar' '$f' && grep -qi 'imagefolder' '$f'"
done
finish
