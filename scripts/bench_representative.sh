#!/usr/bin/env bash
# The representative benchmark sweep: every `mlxcel bench` preset, then every real model under
# models/ (a model folder, or the GGUF files of one), each with `mlxcel bench --json`, gathered into one markdown table. Run it before
# and after any performance change, on the same machine.
#
#   scripts/bench_representative.sh [-o OUT.md] [--only P1,P2] [-- extra bench flags]
#
#   MLXCEL=path/to/mlxcel   the binary (default: target/release/mlxcel, else .gpu/bin/mlxcel)
#   MLXCEL_COMMIT=REV       the commit named in the table (default: git's HEAD here)
#   -o FILE                 write the table there too (default: stdout only); JSON lines go
#                           to FILE.jsonl beside it
#   --only LIST             only these presets or model folder names (comma-separated)
#   after --                flags for every bench run (default: -p 512 -g 128 -r 3), e.g.
#                           -- --device cuda --dtype auto -p 512 -g 128 -r 3
set -euo pipefail
cd "$(dirname "$0")/.."

out="" only=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "bench_representative.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(-p 512 -g 128 -r 3)

bin="${MLXCEL:-}"
if [ -z "$bin" ]; then
  for b in target/release/mlxcel .gpu/bin/mlxcel; do [ -x "$b" ] && { bin="$b"; break; }; done
fi
[ -n "$bin" ] && [ -x "$bin" ] || { echo "bench_representative.sh: no mlxcel binary (build with cargo build --release, or set MLXCEL)" >&2; exit 2; }

wanted() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

jsonl=$(mktemp)
trap 'rm -f "$jsonl"' EXIT
failed=0
run() { # label, bench args...
  local label="$1"; shift
  echo "bench_representative: $label ..." >&2
  local start=$SECONDS
  if line=$("$bin" bench "$@" "${flags[@]}" --json 2> >(grep -v '^\s*$' | sed 's/^/  /' >&2)); then
    echo "$line" | tail -1 >> "$jsonl"
    echo "  done in $((SECONDS - start)) s" >&2
  else
    echo "{\"model\": \"$label\", \"error\": \"bench failed (exit $?)\"}" >> "$jsonl"
    failed=1
  fi
}

for p in $("$bin" bench --list-presets); do
  wanted "$p" && run "$p" --preset "$p"
done
for d in models/*/; do
  name=$(basename "$d")
  if [ -f "$d/config.json" ]; then
    wanted "$name" && run "$name" --model "$d"
  else
    # The GGUF files scripts/get-models.sh fetches (one a folder).
    for f in "$d"*.gguf; do
      [ -f "$f" ] && wanted "$name" && run "$name" --model "$f"
    done
  fi
done

commit="${MLXCEL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
table=$(python3 - "$jsonl" "${flags[*]}" "$commit" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def gb(b): return "–" if b is None else (f"{b/1e9:.2f} GB" if b >= 1e9 else f"{b/1e6:.1f} MB")
def f(x, d=1): return "–" if x is None else f"{x:.{d}f}"
print(f"bench flags: `{sys.argv[2]}`, commit {sys.argv[3]}, device {rows[0].get('device', '?') if rows else '?'}\n")
print("| model | dtype | policy | prefill tok/s | decode tok/s | ms/token | read/token | GB/s | of copy BW | peak memory | AsType/step |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if "error" in r:
        print(f"| {r['model']} | {r['error']} |" + " |" * 9); continue
    share = r.get("bandwidth_share")
    print("| {} | {} | {} | {} ± {} | {} ± {} | {} | {} | {} | {} | {} | {} |".format(
        r["model"], r.get("dtype", "?"), r.get("dtype_policy", "–"),
        f(r.get("prefill_tps_mean")), f(r.get("prefill_tps_std")),
        f(r.get("decode_tps_mean")), f(r.get("decode_tps_std")),
        f(r.get("ms_per_token_mean"), 2), gb(r.get("bytes_per_token")), f(r.get("achieved_gbps_mean")),
        "–" if share is None else f"{share*100:.0f}%", gb(r.get("peak_memory_bytes")),
        r.get("astype_per_step", "–")))
PY
)
echo "$table"
if [ -n "$out" ]; then
  echo "$table" > "$out"
  cp "$jsonl" "${out%.md}.jsonl"
  echo "bench_representative: wrote $out" >&2
fi
exit $failed
