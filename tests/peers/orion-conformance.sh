#!/usr/bin/env bash
# Runs Orion's own functional cases (the conformance suite beside this
# checkout) against the real Orion 4.7.0 built from the peers' sources, and
# lists the cases it passes that weft does not (weft's side is the report
# `.ci/orion-conformance` leaves in target/orion-report.json; run that
# first).
#
#   tests/peers/orion-conformance.sh            # build the peer if missing, run, compare
#
# Each case gets its own Orion, FerretDB and PostgreSQL, as the suite
# starts its broker per case; two run at once.
set -euo pipefail
cd "$(dirname "$0")/../.."
suite=../shared/conformance/orion
peers=${PEERS:-../shared/peers}
out="$PWD/target/peers/orion"
[ -x "$out/bin/contextBroker" ] || "$peers/orion/build.sh" "$out"
report="$PWD/target/peers/orion-conformance-report.json"
run_sh="$(cd "$peers/orion" && pwd)/run.sh"
free_port='python3 -c "import socket;s=socket.socket();s.bind((\"127.0.0.1\",0));print(s.getsockname()[1])"'
# One PostgreSQL port per worker, derived from the broker's port.
server="OUT='$out' PG_PORT=\$((54300 + WEFT_PORT % 90)) DB=postgresql '$run_sh' fg \$WEFT_PORT \$($free_port) \"\$WEFT_DATA\" \$WEFT_BROKER_ARGS"
# A broker killed with its process group leaves the PostgreSQL cluster
# run.sh made for it under /tmp (46 MB each, one per case): the ones this
# run made are removed at the end.
before=$(ls -d /tmp/orion-peer-pg.* 2>/dev/null || true)
cleanup() {
  for d in /tmp/orion-peer-pg.*; do
    [ -e "$d" ] || continue
    grep -qxF "$d" <<<"$before" || rm -rf "$d"
  done
}
trap cleanup EXIT
python3 "$suite/run.py" --server-cmd "$server" --cases "$suite/dev.txt" --jobs 2 \
  --start-timeout 60 --report "$report" >"$PWD/target/peers/orion-conformance.log" 2>&1 || true
python3 - "$report" target/orion-report.json <<'EOF'
import json, sys
peer = {c["id"]: c["status"] for c in json.load(open(sys.argv[1]))["cases"]}
try:
    weft = {c["id"]: c["status"] for c in json.load(open(sys.argv[2]))["cases"]}
except FileNotFoundError:
    sys.exit("no weft report: run .ci/orion-conformance first")
passed = sum(s == "PASS" for s in peer.values())
print(f"the real Orion passes {passed} of {len(peer)} cases; weft {sum(s == 'PASS' for s in weft.values())}")
missing = sorted(k for k, s in peer.items() if s == "PASS" and weft.get(k) != "PASS")
print(f"cases the real Orion passes and weft does not: {len(missing)}")
for k in missing:
    print("  " + k)
sys.exit(1 if missing else 0)
EOF
