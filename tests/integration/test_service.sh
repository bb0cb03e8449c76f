#!/usr/bin/env bash
# test_service.sh - what an administrator installs: the emliod@.service
# unit (hardening, systemd-analyze verify), `emliod --config FILE` (the
# unit's only argument), sd_notify readiness, and the man pages (`man -l`
# and groff render them without warnings).
# Run from the repo root with B=<build dir>.
set -u
. tests/integration/lib.sh

UNIT=dist/emliod@.service
for d in Type=notify NotifyAccess=main DynamicUser=yes ProtectSystem=strict \
    ProtectHome=yes NoNewPrivileges=yes PrivateTmp=yes PrivateDevices=yes \
    CapabilityBoundingSet= RestrictAddressFamilies= SystemCallFilter= \
    'ReadOnlyPaths=' 'LimitNOFILE=' \
    'ExecStart=@BINDIR@/emliod --config /etc/emlio/%i.conf'; do
    check "unit sets $d" grep -q "^$d" "$UNIT"
done
nofile=$(sed -n 's/^LimitNOFILE=//p' "$UNIT")
check "LimitNOFILE ($nofile) covers --max-clients 1024 with room" \
    test "$nofile" -ge 4096

# systemd-analyze verify on an instance, with ExecStart pointing at the
# emliod of this build (verify checks that the binary exists).
if command -v systemd-analyze >/dev/null; then
    mkdir -p "$T/units"
    sed "s|@BINDIR@|$PWD/$B/bin|" "$UNIT" >"$T/units/emliod@.service"
    ln -s "emliod@.service" "$T/units/emliod@demo.service"
    (cd "$T/units" && SYSTEMD_LOG_LEVEL=notice \
        systemd-analyze verify --man=no "$T/units/emliod@demo.service") \
        >"$T/verify.out" 2>&1
    rc=$?
    # Only lines about our unit count; a container may lack other units.
    if [ $rc -eq 0 ] && ! grep -q 'emliod@' "$T/verify.out"; then
        ok "systemd-analyze verify emliod@demo.service"
    else
        fail "systemd-analyze verify emliod@demo.service (rc=$rc)"
        sed 's/^/    /' "$T/verify.out"
    fi
    # The check itself can fail: a unit with an unknown directive is refused.
    sed 's/^NoNewPrivileges=yes/NoNewPrivilegez=yes/' "$T/units/emliod@.service" \
        >"$T/units/bad@.service"
    ln -s "bad@.service" "$T/units/bad@demo.service"
    (cd "$T/units" && systemd-analyze verify --man=no \
        "$T/units/bad@demo.service") >"$T/verify-bad.out" 2>&1
    check "systemd-analyze verify flags a broken unit" \
        grep -q 'NoNewPrivilegez' "$T/verify-bad.out"
else
    skip "systemd-analyze not installed (Debian package systemd)"
fi

# emliod --config: the example config, pointed at a test dataset.
make_dataset "$T/ds" 60 3 2000 32K || fail "dataset"
sed -e "s|^data .*|data $T/ds/shards|" -e "s|^bind .*|bind tcp://127.0.0.1:*|" \
    -e 's|^log-level .*|log-level warn|' dist/emliod.conf.example >"$T/a.conf"
printf '# a comment line\n\nmax-credit = 64\n' >>"$T/a.conf"
: >"$T/cfg.out"
"$EMLIOD" --config "$T/a.conf" >"$T/cfg.out" 2>"$T/cfg.err" &
DPID=$!
PIDS+=("$DPID")
EP=$(listen_addr "$T/cfg.out" emliod "$DPID")
check "emliod --config FILE serves (endpoint $EP)" test -n "$EP"
"$EMLIO" fetch --connect "$EP" --batch 8 --verify --quiet >"$T/f.out" 2>&1
check "fetch from the configured daemon: exactly once" \
    test "$(json_field "$T/f.out" verified)" = True
check "no-write-index from the config is applied" \
    bash -c "! ls '$T/ds/shards' | grep -q 'idx.tmp'"
kill "$DPID"
wait "$DPID" 2>/dev/null

# The command line overrides the file; errors name the file and line.
"$EMLIOD" --config "$T/a.conf" --bind 'tcp://127.0.0.1:1' --version >/dev/null
check "--config with --version exits 0" test $? -eq 0
printf 'data %s\nbind tcp://127.0.0.1:*\nreaders zero\n' "$T/ds/shards" \
    >"$T/bad.conf"
"$EMLIOD" --config "$T/bad.conf" >/dev/null 2>"$T/bad.err"
check "a bad config value is a usage error (exit 2)" test $? -eq 2
check "the message names file and line" \
    grep -q "emliod: $T/bad.conf:3: invalid value 'zero' for --readers" \
    "$T/bad.err"
# Bounded counts say the bound (--transform-threads: 1024, issue 34).
"$EMLIOD" --data "$T/ds/shards" --bind 'tcp://127.0.0.1:*' \
    --transform-threads 5000 >/dev/null 2>"$T/threads.err"
check "--transform-threads 5000 is a usage error (exit 2)" test $? -eq 2
check "  saying the limit" grep -q \
    "invalid value '5000' for --transform-threads: above 1024" "$T/threads.err"
printf 'bogus-option 1\n' >"$T/bad2.conf"
"$EMLIOD" --config "$T/bad2.conf" >/dev/null 2>"$T/bad2.err"
check "an unknown config option is refused" \
    grep -q "bad2.conf:1: unknown option 'bogus-option'" "$T/bad2.err"
"$EMLIOD" --config "$T/missing.conf" >/dev/null 2>"$T/missing.err"
check "a missing config file is an error" \
    grep -q "cannot read config '$T/missing.conf'" "$T/missing.err"
printf 'data %s\nbind tcp://127.0.0.1:1\n' "$T/ds/shards" >"$T/over.conf"
: >"$T/over.out"
"$EMLIOD" --config "$T/over.conf" --bind 'tcp://127.0.0.1:*' \
    --log-level warn >"$T/over.out" 2>&1 &
DPID=$!
PIDS+=("$DPID")
for _ in $(seq 1 200); do
    grep -q 'listening on' "$T/over.out" && break
    sleep 0.05
done
check "--bind on the command line overrides the file" \
    bash -c "grep 'listening on' '$T/over.out' | grep -qv ':1$'"
kill "$DPID"
wait "$DPID" 2>/dev/null

# sd_notify: READY=1 with the endpoint once serving, STOPPING=1 on SIGTERM.
/usr/bin/python3 - "$EMLIOD" "$T" <<'PYEOF' >"$T/notify.out" 2>&1
import os, signal, socket, subprocess, sys
emliod, t = sys.argv[1], sys.argv[2]
path = os.path.join(t, "notify.sock")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(20)
p = subprocess.Popen([emliod, "--config", os.path.join(t, "a.conf")],
                     env=dict(os.environ, NOTIFY_SOCKET=path),
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    ready = s.recv(4096).decode()
    p.send_signal(signal.SIGTERM)
    stopping = s.recv(4096).decode()
    rc = p.wait(timeout=20)
finally:
    if p.poll() is None:
        p.kill()
print(repr(ready), repr(stopping), rc)
ok = (ready.startswith("READY=1\n") and "STATUS=listening on tcp://" in ready
      and "MAINPID=%d" % p.pid in ready and stopping == "STOPPING=1"
      and rc == 0)
sys.exit(0 if ok else 1)
PYEOF
check "emliod notifies READY=1 and STOPPING=1 over NOTIFY_SOCKET" test $? -eq 0 ||
    cat "$T/notify.out"

# Man pages: rendered by man -l, no groff warnings, every subcommand has
# its section in emlio(1) and every emliod option is in emliod(8).
for page in "$B"/man/emliod.8 "$B"/man/emlio.1; do
    LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$page" >"$T/page.txt" \
        2>"$T/page.err"
    check "man -l $(basename "$page") renders" \
        bash -c "[ -s '$T/page.txt' ] && [ ! -s '$T/page.err' ] && grep -q '^NAME' '$T/page.txt'"
    groff -man -Tutf8 -ww -z "$page" 2>"$T/groff.err"
    check "groff -ww: no warnings in $(basename "$page")" test ! -s "$T/groff.err" ||
        cat "$T/groff.err"
done
printf '.TH X 1\n.SH NAME\nx \\- y\n.BOGUS z\n' >"$T/bad.1"
groff -man -Tutf8 -ww -z "$T/bad.1" 2>"$T/groff-bad.err"
check "groff -ww flags a broken page" test -s "$T/groff-bad.err"
LC_ALL=C.UTF-8 MANWIDTH=200 man -l "$B/man/emlio.1" >"$T/emlio.txt" 2>/dev/null
for c in synth pack index inspect fetch plan keygen energy; do
    check "emlio(1) has a section for $c" grep -qE "^   emlio $c" "$T/emlio.txt"
done
check "emlio(1) has no relay section (a benchmark tool)" \
    bash -c "! grep -q 'emlio relay' '$T/emlio.txt'"
LC_ALL=C.UTF-8 MANWIDTH=200 man -l "$B/man/emliod.8" >"$T/emliod.txt" 2>/dev/null
missing=""
for o in $("$EMLIOD" --help | grep -oE '^  --[a-z-]+' | sed 's/^  //'); do
    grep -q -- "$o" "$T/emliod.txt" || missing+=" $o"
done
check "emliod(8) documents every option of emliod --help${missing:+ (missing:$missing)}" \
    test -z "$missing"
VERSION=$(cat VERSION)
check "the man pages carry VERSION" grep -q "EMLIO $VERSION" "$T/emliod.txt"
finish
