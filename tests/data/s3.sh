#!/usr/bin/env bash
# s3:// data against a real S3-compatible server: moto's server (PyPI) on 127.0.0.1 with
# authentication on, so every request's AWS Signature V4 is checked, behind a proxy that
# injects faults (tests/data/s3_server.py). The same corpus is read from local disk and
# from the bucket:
#   - JSONL and TFRecord (written by the PyPI tfrecord package, an independent writer)
#     give the same batches from the bucket as from the same files on disk; the TFRecord
#     twin of the JSONL files gives the JSONL's batches (one stream: same documents in
#     the same order); prepared token shards (data.online_tokenization=false) too;
#     listing over several pages (TETRA_S3_LIST_PAGE=1); byte tokens (data.tokenizer=byte)
#     the same way, of the text field only;
#   - a 2-rank training run from s3:// equals the run from local files, step for step
#     (with a BPE vocabulary and with byte tokens), and resuming its checkpoint from
#     s3:// continues it exactly;
#   - 500s, stalled answers and connections dropped mid-object are retried (same
#     batches); wrong credentials, a missing bucket or object, a server that keeps
#     failing or is not there give one clear line and a non-zero exit, in bounded time.
# Usage: bash s3.sh /path/to/tetra PYTHON   (exit 77: skipped; under CI=true a failure)
set -u
tetra="${1:?usage: $0 /path/to/tetra PYTHON}"
py="${2:-}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
skip() {
  [ "${CI:-}" = true ] && { echo "FAIL: $1 (CI=true; tools/setup-python-refs installs it)"; exit 1; }
  echo "skipped: $1"; exit 77
}
[ -x "$py" ] || skip "no Python references venv"
"$py" -c "import moto, boto3, tfrecord" 2>/dev/null || skip "moto, boto3 or tfrecord missing from $py"
command -v mpirun >/dev/null || skip "no mpirun"
work="$(mktemp -d)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export TETRA_S3_CACHE="$work/cache"
fail() { echo "FAIL: $*"; exit 1; }

# -- The corpus: 4 JSONL shards, their TFRecord twins, one object under a sub-prefix. ----
mkdir -p "$work/data/jsonl/extra" "$work/data/tfrecord"
"$py" - "$work/data" <<'EOF' || fail "could not write the corpus"
import json, os, sys, tfrecord
out = sys.argv[1]
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()
for k in range(4):
    base = f"part-{k:02d}"
    w = tfrecord.TFRecordWriter(f"{out}/tfrecord/{base}.tfrecord")
    with open(f"{out}/jsonl/{base}.jsonl", "w") as f:
        for i in range(150):
            text = f"doc {k}.{i}: " + " ".join(words[(i * 7 + j * k) % len(words)] for j in range(3 + (i * 5 + k) % 23))
            f.write(json.dumps({"id": i, "text": text}) + "\n")
            w.write({"text": (text.encode(), "byte"), "id": (i, "int")})
    w.close()
with open(f"{out}/jsonl/extra/not-matched.jsonl", "w") as f:
    f.write(json.dumps({"text": "a glob's * does not cross a /"}) + "\n")
EOF
"$tetra" tokenizer train --vocab-size 300 --out "$work/tok" "$work/data/jsonl/part-00.jsonl" >"$work/tok.log" 2>&1 ||
  { cat "$work/tok.log"; fail "tokenizer training failed"; }
tok="data.tokenizer=$work/tok/tokenizer.json"
"$tetra" data prepare --tokenizer "$work/tok/tokenizer.json" --out "$work/data/shards" --shard-tokens 4000 \
  "$work/data/jsonl/"part-*.jsonl >"$work/prepare.log" 2>&1 || { cat "$work/prepare.log"; fail "tetra data prepare"; }

# -- The server. ---------------------------------------------------------------------------
"$py" "$root/tests/data/s3_server.py" --dir "$work/data" --bucket corpus --env "$work/env.sh" \
  --faults "$work/faults.json" >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 120); do [ -f "$work/env.sh" ] && break; kill -0 "$server" 2>/dev/null || break; sleep 0.25; done
[ -f "$work/env.sh" ] || { cat "$work/server.log"; fail "the S3 server did not start"; }
# shellcheck disable=SC1091
. "$work/env.sh"

batches() {   # batches OUT PATH [section.key=value...]
  local out="$1"; shift
  # Blocks of 4 KB: each object is read in several ranged GETs, through the read-ahead.
  "$tetra" -e 'dofile(arg[1])' "$root/tests/data/batches.lua" "$1" 6 "$tok" data.s3_block_mb=0.004 "${@:2}" >"$out" 2>&1
}
same() {   # same A B WHAT
  cmp -s "$1" "$2" || { echo "--- $1"; head -c 600 "$1"; echo; echo "--- $2"; head -c 600 "$2"; echo; fail "$3"; }
}

# -- Same batches from the bucket as from disk. ------------------------------------------
batches "$work/local_jsonl" "$work/data/jsonl/*.jsonl" || { cat "$work/local_jsonl"; fail "local JSONL"; }
batches "$work/s3_jsonl" "s3://corpus/jsonl/*.jsonl" || { cat "$work/s3_jsonl"; fail "s3 JSONL"; }
same "$work/local_jsonl" "$work/s3_jsonl" "JSONL batches from s3:// differ from the local files'"
TETRA_S3_LIST_PAGE=1 batches "$work/s3_paged" "s3://corpus/jsonl/*.jsonl" || { cat "$work/s3_paged"; fail "paged listing"; }
same "$work/local_jsonl" "$work/s3_paged" "a listing over several pages gives other batches"
[ "$(grep -c 'continuation-token=' "$work/faults.json.log")" -ge 3 ] || fail "the listing did not page"
batches "$work/local_tf" "$work/data/tfrecord/*.tfrecord" || { cat "$work/local_tf"; fail "local TFRecord"; }
batches "$work/s3_tf" "s3://corpus/tfrecord/*.tfrecord" || { cat "$work/s3_tf"; fail "s3 TFRecord"; }
same "$work/local_tf" "$work/s3_tf" "TFRecord batches from s3:// differ from the local files'"
batches "$work/one_jsonl" "$work/data/jsonl/*.jsonl" data.num_streams=1 || fail "one-stream JSONL"
batches "$work/one_tf" "s3://corpus/tfrecord/*.tfrecord" data.num_streams=1 || fail "one-stream TFRecord"
same "$work/one_jsonl" "$work/one_tf" "the TFRecord twin's documents differ from the JSONL's"
batches "$work/local_tok" "$work/data/shards/*.tok" data.online_tokenization=false || { cat "$work/local_tok"; fail "local shards"; }
batches "$work/s3_tok" "s3://corpus/shards/*.tok" data.online_tokenization=false || { cat "$work/s3_tok"; fail "s3 shards"; }
same "$work/local_tok" "$work/s3_tok" "prepared shards from s3:// differ from the local ones"
echo "ok: JSONL, TFRecord and prepared-shard batches from s3:// equal local ones (also over paged listings)"

# -- Byte tokens (data.tokenizer=byte, the default) through the same pipeline. ----------
batches "$work/local_bytes" "$work/data/jsonl/*.jsonl" data.tokenizer=byte || { cat "$work/local_bytes"; fail "local JSONL, byte tokens"; }
batches "$work/s3_bytes" "s3://corpus/jsonl/*.jsonl" data.tokenizer=byte || { cat "$work/s3_bytes"; fail "s3 JSONL, byte tokens"; }
same "$work/local_bytes" "$work/s3_bytes" "byte-token batches from s3:// differ from the local files'"
# the text field's bytes ('d' of "doc" among them), never the JSON around it ({, }, ")
grep -qw 100 "$work/s3_bytes" || fail "no text in the byte-token batches"
! grep -qwE '123|125|34' "$work/s3_bytes" || fail "byte tokens of JSONL hold the JSON's braces or quotes"
echo "ok: byte tokens from s3:// JSONL equal local ones, the text field only"

# -- Training from the bucket: 2 ranks, checkpoint, resume. -----------------------------
fields() { cut -d, -f1-4 "$1"; }
train() {   # train METRICS INPUT [--set ...]
  local m="$1" input="$2"; shift 2
  mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" \
    --set parallel.data_parallel_size=2 --set train.steps=6 --set model.vocab_size=300 \
    --set data.input_path="$input" --set "$tok" --set log.metrics_file="$m" --set data.s3_block_mb=0.004 "$@"
}
train "$work/local.jsonl" "$work/data/jsonl/*.jsonl" >"$work/train_local.log" 2>&1 ||
  { cat "$work/train_local.log"; fail "training from local files"; }
train "$work/s3.jsonl" "s3://corpus/jsonl/*.jsonl" --set checkpoint.dir="$work/ckpt" \
  --set checkpoint.every=3 >"$work/train_s3.log" 2>&1 || { cat "$work/train_s3.log"; fail "training from s3://"; }
grep -q "s3://corpus/jsonl/\*.jsonl" "$work/train_s3.log" || { cat "$work/train_s3.log"; fail "the start-up summary does not name the s3:// source"; }
[ "$(wc -l <"$work/s3.jsonl")" -eq 6 ] || fail "expected 6 metrics records"
diff <(fields "$work/local.jsonl") <(fields "$work/s3.jsonl") || fail "training from s3:// differs from local files"
rm -rf "$work/ckpt/step_000006"
echo step_000003 >"$work/ckpt/latest"
head -n 3 "$work/s3.jsonl" >"$work/resumed.jsonl"
train "$work/resumed.jsonl" "s3://corpus/jsonl/*.jsonl" --set checkpoint.dir="$work/ckpt" \
  --set checkpoint.resume=true >"$work/train_resume.log" 2>&1 || { cat "$work/train_resume.log"; fail "resuming from s3://"; }
diff <(fields "$work/s3.jsonl") <(fields "$work/resumed.jsonl") || fail "the resumed s3:// run differs"
echo "ok: 2-rank training from s3:// equals local files; its resume continues exactly"
train "$work/local_bytes.jsonl" "$work/data/jsonl/*.jsonl" --set data.tokenizer=byte >"$work/train_local_bytes.log" 2>&1 ||
  { cat "$work/train_local_bytes.log"; fail "training on byte tokens from local files"; }
train "$work/s3_bytes.jsonl" "s3://corpus/jsonl/*.jsonl" --set data.tokenizer=byte >"$work/train_s3_bytes.log" 2>&1 ||
  { cat "$work/train_s3_bytes.log"; fail "training on byte tokens from s3://"; }
[ "$(wc -l <"$work/s3_bytes.jsonl")" -eq 6 ] || fail "expected 6 metrics records (byte tokens)"
diff <(fields "$work/local_bytes.jsonl") <(fields "$work/s3_bytes.jsonl") || fail "byte-token training from s3:// differs from local files"
echo "ok: 2-rank training on byte tokens from s3:// equals local files"

# -- Faults the client must ride out. ----------------------------------------------------
fault() {   # fault JSON WHAT [section.key=value...]
  echo "$1" >"$work/faults.json"
  local before; before=$(grep -c injected "$work/faults.json.log" || true)
  local t0=$SECONDS
  batches "$work/faulty" "s3://corpus/jsonl/*.jsonl" "${@:3}" || { cat "$work/faulty"; fail "$2: the read failed"; }
  same "$work/local_jsonl" "$work/faulty" "$2: other batches"
  [ "$(cat "$work/faults.json")" != "$1" ] || fail "$2: no fault was injected"
  echo "ok: $2 retried ($((SECONDS - t0)) s)"
}
fault '{"status": [3, 500]}' "three HTTP 500 answers"
fault '{"status": [2, 503]}' "two HTTP 503 answers"
fault '{"stall": [2, 4]}' "two answers stalled 4 s" data.s3_timeout_s=1
fault '{"drop": 3}' "three connections dropped mid-object"
echo '{}' >"$work/faults.json"

# -- Errors: one clear line, non-zero exit, bounded time. ---------------------------------
refused() {   # refused PATTERN WHAT COMMAND...
  local want="$1" what="$2"; shift 2
  local t0=$SECONDS
  if timeout -k 10 60 "$@" >"$work/err.log" 2>&1; then cat "$work/err.log"; fail "$what: accepted"; fi
  grep -q -- "$want" "$work/err.log" || { cat "$work/err.log"; fail "$what: no line matching '$want'"; }
  ! grep -q "stack traceback" "$work/err.log" || { cat "$work/err.log"; fail "$what: a traceback"; }
  echo "ok: $what: $(grep -m1 -- "$want" "$work/err.log") ($((SECONDS - t0)) s)"
}
run1=("$tetra" run "$root/recipes/tiny.lua" --set train.steps=1 --set train.warmup_steps=0 --set model.vocab_size=300 --set "$tok")
refused "SignatureDoesNotMatch.*AWS_SECRET_ACCESS_KEY" "wrong secret key" \
  env AWS_SECRET_ACCESS_KEY=wrong "$tetra" run "$root/recipes/tiny.lua" --set train.steps=1 --set train.warmup_steps=0 \
  --set model.vocab_size=300 --set "$tok" --set data.input_path='s3://corpus/jsonl/*.jsonl'
refused "InvalidAccessKeyId\|SignatureDoesNotMatch" "unknown access key" \
  env AWS_ACCESS_KEY_ID=AKIANOTAKEY "$tetra" run "$root/recipes/tiny.lua" --set train.steps=1 --set train.warmup_steps=0 \
  --set model.vocab_size=300 --set "$tok" --set data.input_path='s3://corpus/jsonl/*.jsonl'
refused "s3://corpus/jsonl/missing.jsonl' matches no object" "missing object" \
  "${run1[@]}" --set data.input_path=s3://corpus/jsonl/missing.jsonl
refused "NoSuchBucket" "missing bucket" "${run1[@]}" --set data.input_path='s3://no-such-bucket/*.jsonl'
echo '{"status": [1000, 500]}' >"$work/faults.json"
refused "giving up after 3 tries: HTTP 500" "a server that keeps failing" \
  "${run1[@]}" --set data.input_path='s3://corpus/jsonl/*.jsonl' --set data.s3_retries=2
echo '{}' >"$work/faults.json"
refused "giving up after 2 tries: Couldn't connect" "no server" \
  "${run1[@]}" --set data.input_path='s3://corpus/jsonl/*.jsonl' --set data.s3_retries=1 --set data.s3_endpoint=http://127.0.0.1:9
refused "no S3 credentials: set AWS_ACCESS_KEY_ID" "no credentials" \
  env -u AWS_ACCESS_KEY_ID "$tetra" run "$root/recipes/tiny.lua" --set train.steps=1 --set train.warmup_steps=0 \
  --set model.vocab_size=300 --set "$tok" --set data.input_path='s3://corpus/jsonl/*.jsonl'
echo PASS
