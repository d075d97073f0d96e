#!/usr/bin/env bash
# The checks to run on a GPU machine (docs/development.md#running-it-on-a-gpu-machine).
#
#   dev/gpu_check.sh 1|2|3|step|recipe|all [--dry-run] [--out DIR] [--budget SECONDS] [--data DIR]
#
#   1  training speed: bench_train at the recipe's size, transformer-base and transformer-big,
#      ours against torch.nn.Transformer and MarianMTModel on Multi30k batches, then ours
#      compiled at the first two: tokens/s, step-time percentiles, MFU, memory, the SDPA backend
#      that ran, kernels, GPU busy share and host ms of a profiled step (train_bench.txt,
#      train_steps.json)
#   2  the recipe's pace: experiment=multi30k_en_de for 1,200 updates as it is (progress bar,
#      validation and attention maps at their cadence), without the progress bar, without
#      validation, with the validation batches of before (4,096 tokens) and compiled
#      (recipe_pace.log, recipe_pace.json); then what each part of a validation costs
#      (bench_validation: loss, decoding at both budgets, BLEU, maps; validation.txt)
#   3  decoding and tests: bench_decode as evaluate.py batches test_2016_flickr, bench_attention
#      (decode.txt); the CUDA and GPU-relevant tests (tests.log, tests.xml)
#   step  the product's own training step, measured (bench_train: ours as train.py builds it):
#      transformer-base against torch.nn.Transformer and MarianMTModel with the loss kernels
#      (compiled, liger when its wheel is installed) and compile=layers; the recipe's size with
#      compile=layers and CUDA graphs (compile=true, 8 shape buckets); transformer-big; base
#      compiled and with CUDA graphs (4 buckets); each system's time by category and padding
#      (step_bench.txt, step_runs.json); then the CUDA tests of those options (step_tests.log).
#      Under 9 minutes, so that a 15-minute GPU lease can run it twice
#   recipe  the Multi30k GPU recipe to its end, stopped (SIGTERM: last.ckpt written) so that the
#      command ends in time; run again at once (the machine still warm) it resumes from
#      last.ckpt; then the average of the last 10 epochs, beam 5, on the three test sets
#      (recipe.log, recipe_metrics.json)
#
# Every stage writes env.txt (the machine), ends with a summary table of its steps (summary.txt)
# and, last, its results as markdown tables for docs/benchmarks.md (results.md). Files go to --out
# DIR, else $OUT (the GPU tool's folder that comes back), else outputs/gpu_check/out: at most 8 a
# stage. Each stage keeps within --budget seconds (default 540, under the tool's 10 minutes a
# command): every step runs under `timeout`, capped by what is left. The exit status is 1 if a
# step failed.
#
# --dry-run runs every step at tiny size on the CPU (tiny model, a synthetic corpus unless
# --data DIR, bench scripts at their test sizes, pytest --collect-only, torch.compile switched
# off by TORCHDYNAMO_DISABLE; a run that would repeat another's tiny work is composed and checked
# only): the command lines of a real run, checked anywhere in minutes.
#
# The interpreter is $PYTHON, default python3 (the venv's, when one is active).
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  exit "${1:-0}"
}

STAGE=""
DRY=0
OUT_DIR="${OUT:-}"
BUDGET=540
DATA_ARG=""
while (($#)); do
  case "$1" in
    1 | 2 | 3 | step | recipe | all) STAGE=$1 ;;
    --dry-run) DRY=1 ;;
    --out) OUT_DIR=${2:?--out needs a directory}; shift ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift ;;
    --data) DATA_ARG=${2:?--data needs a directory}; shift ;;
    -h | --help) usage 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; usage 2 >&2 ;;
  esac
  shift
done
[[ -n $STAGE ]] || { echo "gpu_check.sh: name a stage: 1, 2, 3, step, recipe or all" >&2; usage 2 >&2; }
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: --budget takes whole seconds" >&2; usage 2 >&2; }

cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
HELP=("$PY" "$ROOT/dev/gpu_check.py")
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
# The project is not pip-installed on the GPU machine: it runs from this checkout.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# No network there: wandb logs offline, Hugging Face libraries never try the hub.
export WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export HF_DATASETS_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
SITE=${GPU_CHECK_SITE:-/tmp/site}  # where the .whl/ wheels go (device-wheels.sh's command)

OUT_DIR=${OUT_DIR:-outputs/gpu_check/out}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
STEPS=$TMP/steps.tsv
: >"$STEPS"
if ((DRY)); then
  WORK=$TMP/work  # a dry run leaves nothing behind
else
  # Ignored by git, so it survives between two commands while the GPU machine stays warm:
  # the recipe stage's second call resumes from here.
  WORK=$ROOT/outputs/gpu_check
fi
CACHE_ARGS=()
((DRY)) && CACHE_ARGS=("data.cache_dir=$TMP/cache")  # real runs share data/cache across stages
# A dry run checks command lines, not speed: one thread per process, since torch's OpenMP threads
# stall (a tiny training step 5x slower) when other work shares a 2-core machine.
((DRY)) && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# Dry runs: the tiny model on the synthetic corpus (SentencePiece needs a small vocabulary for
# it), no loader workers, a log line every step (a few steps must show a loss), no sanity check,
# BLEU on 8 validation sentences, and the attention-map callback kept on but cheap (one type,
# one probe).
DRY_TRAIN=()
DRY_VOCAB=64
[[ -z $DATA_ARG ]] || DRY_VOCAB=1000  # a real corpus has more characters than 64 pieces hold
if ((DRY)); then
  DRY_TRAIN=(model=tiny "data.vocab_size=$DRY_VOCAB" data.num_workers=0 trainer.log_every_n_steps=1
    trainer.num_sanity_val_steps=0 validation.bleu_sentences=8 "${CACHE_ARGS[@]}"
    "callbacks.attention_maps.types=[cross]" callbacks.attention_maps.num_probes=1
    callbacks.attention_maps.stats_sentences=8 callbacks.attention_maps.num_samples=2)
fi

# ---------------------------------------------------------------------------------------------
# Steps: each runs under a time limit, appends its output to a log, and leaves a summary row.

STAGE_START=$SECONDS
CUR=""
RC=0
STATUS=ok
LAST_SECONDS=0

remaining() { echo $((BUDGET - (SECONDS - STAGE_START))); }

# record NAME STATUS SECONDS NOTE: one row of the summary table.
record() {
  local note=${4//$'\t'/ }
  printf '%s\t%s\t%s\t%s\t%s\n' "$CUR" "$1" "$2" "$3" "${note//$'\n'/ }" >>"$STEPS"
  printf '[gpu_check %s] %-28s %-8s %4ss  %s\n' "$CUR" "$1" "$2" "$3" "${note//$'\n'/ }"
}

# run_step MAX_SECONDS LOG CMD...: run CMD with its output appended to LOG, under the smaller
# of MAX_SECONDS and what is left of the stage's budget (less 15 s for the summary). Sets RC,
# STATUS (ok, FAIL, timeout or skip) and LAST_SECONDS; never stops the script, so that one
# failing check does not hide the others.
run_step() {
  local max=$1 log=$2
  shift 2
  local left limit start
  left=$(($(remaining) - 15))
  limit=$((max < left ? max : left))
  if ((limit < 10)); then
    RC=124 STATUS=skip LAST_SECONDS=0
    printf '\n$ %s\n# skipped: no time left in the stage budget\n' "$*" >>"$log"
    return 0
  fi
  {
    printf '\n$'
    printf ' %q' "$@"
    printf '\n# time limit %ss\n' "$limit"
  } >>"$log"
  start=$SECONDS
  RC=0
  # -k: a command that ignores SIGTERM (a stuck CUDA call) is killed 20 s later
  timeout -k 20 "$limit" "$@" >>"$log" 2>&1 || RC=$?
  LAST_SECONDS=$((SECONDS - start))
  printf '# exit status %s after %ss\n' "$RC" "$LAST_SECONDS" >>"$log"
  case $RC in
    0) STATUS=ok ;;
    124 | 137) STATUS=timeout ;;
    *) STATUS=FAIL ;;
  esac
}

# key=value lines of `gpu_check.py run-info` -> the one value asked for.
kv() { sed -n "s/^$1=//p" "$2" | head -n 1; }

# ---------------------------------------------------------------------------------------------
# Set-up shared by the stages: packages, GPU, data.

deps_import() { "$PY" -c 'import hydra, omegaconf, datasets, wandb' >/dev/null 2>&1; }

# hydra, datasets and wandb are not on the GPU machine: device-wheels.sh (run beforehand on a
# machine with a package index) puts their wheels in .whl/, which travels with the tree.
ensure_deps() {
  local log=$1
  if deps_import; then
    record deps ok 0 "hydra, datasets, wandb import"
    return 0
  fi
  if [[ -d $SITE ]] && PYTHONPATH="$SITE:$PYTHONPATH" deps_import; then
    export PYTHONPATH="$SITE:$PYTHONPATH"
    record deps ok 0 "from $SITE (installed by an earlier stage)"
    return 0
  fi
  if ! compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
    record deps FAIL 0 "hydra/datasets/wandb missing and no .whl/: run ../shared/tools/device-wheels.sh in the repo root beforehand and carry .whl"
    return 0
  fi
  run_step 180 "$log" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" "$ROOT"/.whl/*.whl
  export PYTHONPATH="$SITE:$PYTHONPATH"
  if [[ $STATUS == ok ]] && ! deps_import; then
    STATUS=FAIL
    "$PY" -c 'import hydra, omegaconf, datasets, wandb' >>"$log" 2>&1 || true
  fi
  record deps "$STATUS" "$LAST_SECONDS" "installed $(find "$ROOT/.whl" -name '*.whl' | wc -l) wheels into $SITE"
}

# A real run needs the GPU: without one every figure would be a CPU figure under a GPU label.
require_gpu() {
  ((DRY)) && return 0
  if ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    record gpu FAIL 0 "torch sees no CUDA device; on a CPU machine use --dry-run"
    finish
  fi
}

MULTI30K_FILES=(train val test_2016_flickr test_2017_flickr test_2017_mscoco)
DATA=""
ensure_data() {
  [[ -n $DATA ]] && return 0
  if [[ -n $DATA_ARG ]]; then
    DATA=$(cd "$DATA_ARG" && pwd)
  elif ((DRY)); then
    DATA=$TMP/multi30k
    "${HELP[@]}" corpus "$DATA" >/dev/null
  else
    DATA=$ROOT/data/multi30k
  fi
  local missing=() split lang
  for split in "${MULTI30K_FILES[@]}"; do
    for lang in en de; do
      [[ -f $DATA/$split.$lang.gz ]] || missing+=("$split.$lang.gz")
    done
  done
  if ((${#missing[@]})); then
    record data FAIL 0 "missing in $DATA: ${missing[*]} (mkdir -p data/multi30k && cp ../shared/data/multi30k/*.gz data/multi30k/, and carry data/multi30k)"
    finish
  fi
  local kind="Multi30k"
  ((DRY)) && [[ -z $DATA_ARG ]] && kind="synthetic (dry run)"
  record data ok 0 "$kind corpus in $DATA"
  mkdir -p "$WORK"  # only now: a run that stops before (no GPU, no data) leaves nothing
}

# ---------------------------------------------------------------------------------------------
# Every stage: the machine (env.txt).

write_env() {
  local env=$OUT_DIR/env.txt
  {
    echo "# gpu_check stage $CUR, $(date -u +%FT%TZ), dry_run=$DRY, commit $COMMIT"
    if command -v nvidia-smi >/dev/null; then
      timeout 60 nvidia-smi || echo "nvidia-smi failed: $?"
      timeout 60 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm,power.limit --format=csv || true
    else
      echo "nvidia-smi: not found"
    fi
  } >>"$env" 2>&1
  run_step 90 "$env" "${HELP[@]}" env
  record env "$STATUS" "$LAST_SECONDS" "$(grep -E '^(gpu_name|torch|torch_cuda|cudnn|flash_attention_impl)=' "$env" | tr '\n' ' ')"
}

# Set-up shared by the stages: packages, GPU, the machine, data.
begin_stage() {
  : >"$OUT_DIR/env.txt"
  ensure_deps "$OUT_DIR/env.txt"
  require_gpu
  write_env
  ensure_data
}

# ---------------------------------------------------------------------------------------------
# Stage 1: training speed.

stage1() {
  local bench=$OUT_DIR/train_bench.txt
  : >"$bench"
  begin_stage
  # bench_train (bench/bench_train.py): the product's own training step (the module and Trainer
  # train.py builds, its precision, casts, clipping and fused AdamW) on the project's own
  # Multi30k batches (data/cache shares the tokenizer and ids with train.py), padded as the
  # config pads them; a warm pass over every batch shape, then 50 timed batches per system in a
  # fixed order and its reverse, then 20 steps of ours profiled by category. First ours against
  # torch.nn.Transformer and MarianMTModel at each size; then ours against ours compiled alone
  # (a compilation that runs long costs those runs only), at the recipe's size and base.
  local common=(--data "$DATA") compose=()
  local compile_env=()
  ((DRY)) && dry_bench_options
  local run preset limit extra merged=()
  # GPU_CHECK_RUNS: a subset (e.g. "base big") to rerun the runs that failed.
  for run in ${GPU_CHECK_RUNS:-recipe base big recipe-compiled base-compiled}; do
    preset=${run%-compiled}
    case $run in
      *-compiled) limit=150 extra=(--no-peers --variant compiled compile=true) ;;
      big) limit=150 extra=() ;;
      *) limit=120 extra=() ;;
    esac
    # A dry run trains the tiny model whatever the preset: recipe and recipe-compiled train it,
    # the other presets are composed and checked (what a dry run can tell of them).
    local options=("${common[@]}")
    ((DRY)) && [[ $preset != recipe ]] && options=("${compose[@]}")
    bench_run "$bench" "$run" "$preset" "$limit" "$WORK/bench_train_$run.json" \
      "${options[@]}" "${extra[@]}"
    merged+=("$run=$WORK/bench_train_$run.json")
  done
  "${HELP[@]}" merge-json "$OUT_DIR/train_steps.json" "${merged[@]}" >>"$bench" 2>&1 || true
}

# A dry run's bench_train options (the caller's locals): common, the tiny model trained on the
# CPU; compose, the preset's config composed and checked, nothing trained (--compose-only).
dry_bench_options() {
  local data=(--data "$DATA" --data-vocab "$DRY_VOCAB" --cache-dir "$TMP/cache")
  common=(--dry-run "${data[@]}")
  compose=(--compose-only --device cpu "${data[@]}")
  compile_env=(env TORCHDYNAMO_DISABLE=1)
}

# bench_run LOG NAME PRESET LIMIT JSON [OPTION...]: one bench_train run (its output appended to
# LOG, its steps to JSON, the caller's compile_env before it) and its summary row.
bench_run() {
  local log=$1 name=$2 preset=$3 limit=$4 json=$5
  shift 5
  rm -f "$json"
  run_step "$limit" "$log" "${compile_env[@]}" "$PY" bench/bench_train.py --preset "$preset" \
    "$@" --out "$json"
  local note
  if [[ $STATUS == ok && " $* " == *" --compose-only "* ]]; then
    note="dry run: composed only"
  else
    note=$(bench_note train "$log")
  fi
  record "bench_train $name" "$STATUS" "$LAST_SECONDS" "$note"
}

# pytest's result lines ("170 passed, 9 skipped in 80s", "179 tests collected in 4s") of the
# step last appended to LOG, one per pytest process.
pytest_result() {
  awk '/^\$ /{buf=""} /(passed|failed|error|collected|no tests ran).* in [0-9.]+s/{buf=buf $0 "; "} END{printf "%s", buf}' "$1"
}

# ---------------------------------------------------------------------------------------------
# Stage 2: the recipe's pace, and what a validation costs.

stage2() {
  local log=$OUT_DIR/recipe_pace.log pace=$OUT_DIR/recipe_pace.json
  : >"$log"
  rm -f "$pace"
  begin_stage
  # experiment=multi30k_en_de for 1,200 updates (10 epochs: 10 validations with val BLEU on
  # all 1,014 sentences, the attention maps at the 1st and 6th), Lightning's SimpleProfiler
  # written beside (the fit loop's seconds), each change on its own: updates / fit-loop seconds,
  # and the recipe's fit loop against the same updates without validation (training's share;
  # the maps run at validations only).
  local steps=1200
  ((DRY)) && steps=6
  local names=("recipe" "no progress bar" "no validation" "validation batches of 4096" "compiled")
  local changes=("" "trainer.enable_progress_bar=false"
    "trainer.limit_val_batches=0"
    "validation.max_tokens=4096" "compile=true data.pad_to_multiple=8")
  local i run extra compose
  for i in "${!names[@]}"; do
    run=$WORK/pace/run$i
    rm -rf "$run"
    read -r -a extra <<<"${changes[$i]}"
    # A dry run trains the recipe and the run without validation; the others' overrides are
    # only composed (hydra --cfg job), which is what a dry run can tell of them.
    compose=()
    ((DRY)) && ((i != 0 && i != 2)) && compose=(--cfg job)
    run_step 150 "$log" "$PY" train.py experiment=multi30k_en_de \
      "data.root=$DATA" data.download=false logger=csv "hydra.run.dir=$run" \
      "trainer.max_steps=$steps" +trainer.profiler._target_=lightning.pytorch.profilers.SimpleProfiler \
      "+trainer.profiler.dirpath=$run" +trainer.profiler.filename=profile \
      "${extra[@]}" "${DRY_TRAIN[@]}" "${compose[@]}"
    local status=$STATUS secs=$LAST_SECONDS note
    if ((${#compose[@]})); then
      note="dry run: composed only"
    elif [[ $STATUS == ok ]]; then
      note=$("${HELP[@]}" pace "$run" "$pace" --variant "${names[$i]}" \
        --overrides "${changes[$i]}" --seconds "$secs" 2>&1 | tail -n 1)
    else
      note=$(failure_note "$log")
    fi
    record "pace: ${names[$i]}" "$status" "$secs" "$note"
  done
  # What each part of one validation costs, on the first run's checkpoint: the loss pass and
  # greedy decoding at both budgets, BLEU, the attention maps (training thread, worker).
  local validation=$OUT_DIR/validation.txt ckpt=$WORK/pace/run0/checkpoints/last.ckpt
  : >"$validation"
  local args=(--data "$DATA" --device cuda --rounds 3)
  # (a dry run's maps as its training's: one type, one probe)
  ((DRY)) && args=(--data "$DATA" --device cpu --rounds 1 --cache-dir "$TMP/cache"
    --max-tokens 256,2048 --maps "types=[cross]" --maps num_probes=1 --maps stats_sentences=8
    --maps num_samples=2)
  run_step 150 "$validation" "$PY" bench/bench_validation.py "$ckpt" "${args[@]}"
  record "bench_validation" "$STATUS" "$LAST_SECONDS" "$(bench_note validation "$validation")"
}

# ---------------------------------------------------------------------------------------------
# Stage 3: decoding, and the tests.

stage3() {
  local decode_log=$OUT_DIR/decode.txt tests=$OUT_DIR/tests.log
  : >"$decode_log"
  : >"$tests"
  begin_stage

  # bench_decode: beam 5, bf16 weights, test_2016_flickr in evaluate.py's batches (4096 source
  # tokens) with the reference lengths (sentences end at different steps, as a trained model's
  # do), then equal lengths (the cost of one step alone); beam and greedy; ours with the whole
  # search step in one CUDA graph (the default) and with the model's step alone graphed
  # (--compare-search). Marian when transformers imports, CTranslate2 when its build runs here.
  local marian=()
  "$PY" -c 'import transformers' >/dev/null 2>&1 || marian=(--no-marian)
  local decode=("$PY" bench/bench_decode.py --root "$DATA" --split test_2016_flickr --beam 5
    --dtype bfloat16 --max-tokens 4096 --compare-search "${marian[@]}")
  if ((DRY)); then
    decode=("$PY" bench/bench_decode.py --root "$DATA" --split test_2016_flickr --beam 5
      --dtype bfloat16 --max-tokens 64 --compare-search "${marian[@]}" --cache-dir "$TMP/cache"
      --limit 12 --vocab "$DRY_VOCAB" --d-model 32 --heads 2 --layers 1 --d-ff 64 --length 4)
  fi
  local lengths
  for lengths in reference equal; do
    run_step 150 "$decode_log" "${decode[@]}" --lengths "$lengths"
    record "bench_decode $lengths" "$STATUS" "$LAST_SECONDS" "$(bench_note decode "$decode_log")"
  done

  # bench_attention: its four fixed shapes (two training, two decoding), float32 vs bf16; the
  # script has no option for padded/masked shapes.
  local device=cuda repeat=30
  ((DRY)) && device=cpu repeat=1
  run_step 90 "$decode_log" "$PY" bench/bench_attention.py --device "$device" --repeat "$repeat"
  record "bench_attention" "$STATUS" "$LAST_SECONDS" "$(bench_note attention "$decode_log")"

  # The tests: those marked `cuda` (alone: they may measure the GPU), then the files whose code
  # paths a GPU changes (precision, fused optimizer, attention kernels, decoding, training,
  # evaluation), in three pytest processes at once (minutes one after the other; 16 cores). A
  # dry run only collects them (seconds instead of minutes on 2 cores).
  local pytest=(-q -ra --durations=15 -p no:cacheprovider)
  ((DRY)) && pytest+=(--collect-only)
  local shards=("tests/training/test_train.py"
    "tests/evaluation/test_evaluate.py tests/decoding/test_decoding.py"
    "tests/training/test_precision_matrix.py tests/training/test_loss.py tests/test_attention.py")
  local present=() absent=() shard f kept
  for shard in "${shards[@]}"; do
    kept=""
    for f in $shard; do
      if [[ -f $f ]]; then kept+="$f "; else absent+=("$f"); fi
    done
    [[ -z $kept ]] || present+=(--shard "$kept")
  done
  # tests that need the real corpus find it here; elsewhere they skip
  ((DRY)) || export MULTI30K_DIR=$DATA
  run_step 150 "$tests" "$PY" -m pytest "${pytest[@]}" -m cuda --junitxml "$WORK/junit_cuda.xml"
  if ((RC == 5)); then  # pytest: no test selected
    record "pytest -m cuda" warn "$LAST_SECONDS" "no test carries the cuda marker (tests/test_cuda.py missing?)"
  else
    record "pytest -m cuda" "$STATUS" "$LAST_SECONDS" "$(pytest_result "$tests")"
  fi
  local threads=$(($(nproc) / 3))
  ((threads >= 1)) || threads=1
  run_step 300 "$tests" "${HELP[@]}" pytest-shards --threads "$threads" \
    --junit "$WORK/junit_units.xml" "${present[@]}" -- "${pytest[@]}"
  local note
  note=$(pytest_result "$tests")
  ((${#absent[@]} == 0)) || note+="; not in this tree: ${absent[*]}"
  record "pytest GPU-relevant files" "$STATUS" "$LAST_SECONDS" "$note"
  "${HELP[@]}" junit-merge "$OUT_DIR/tests.xml" "cuda=$WORK/junit_cuda.xml" \
    "units=$WORK/junit_units.xml" >>"$tests" 2>&1 || true
}

# The output of the step last appended to LOG (after its last "$ " command line).
last_section() { awk '/^\$ /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' "$1"; }

# Why the step last appended to LOG failed: its last error line, else its exit status.
failure_note() {
  local line
  line=$(last_section "$1" | grep -E '^error:|Error|Exception|Killed' | tail -n 1 | cut -c1-300) || true
  echo "${line:-exit status $RC}"
}

# The note of the bench output just appended to LOG.
bench_note() {
  local kind=$1 log=$2
  if [[ $STATUS == ok ]]; then
    last_section "$log" >"$TMP/last_bench.txt"
    "${HELP[@]}" note "$kind" "$TMP/last_bench.txt"
  else
    failure_note "$log"
  fi
}

# ---------------------------------------------------------------------------------------------
# Stage step: the product's own training step, and the options that may speed it up.

stage_step() {
  local bench=$OUT_DIR/step_bench.txt tests=$OUT_DIR/step_tests.log
  : >"$bench"
  : >"$tests"
  begin_stage
  # bench_train (bench/bench_train.py) times ours as train.py builds it, on Multi30k batches as
  # the product makes them: a warm pass over every shape, 30 timed batches a system, then 20
  # steps of ours and of each variant (train.py overrides, each in a fit of its own) profiled by
  # category. Run by run, most wanted first: a run that runs out of time costs itself alone.
  local common=(--data "$DATA" --steps 30 --profile-steps 20) compose=()
  local compile_env=()
  ((DRY)) && dry_bench_options
  # Liger-Kernel travels as a wheel (../shared/tools/device-wheels.sh liger-kernel==0.8.5) and
  # needs Triton on CUDA: without them its loss is left out.
  local liger=()
  if ! ((DRY)) && "$PY" -c 'import liger_kernel.transformers.functional' >/dev/null 2>&1; then
    liger=(--variant "liger loss" loss.kernel=liger)
  else
    record "liger-kernel" skip 0 "not importable here (or a dry run): loss.kernel=liger left out"
  fi
  local graphs8=(--variant "CUDA graphs" "compile=true data.num_buckets=8 data.pad_to_multiple=8")
  local graphs4=(--variant "CUDA graphs" "compile=true data.num_buckets=4 data.pad_to_multiple=8")
  local run preset limit extra merged=()
  # GPU_CHECK_RUNS: a subset (e.g. "big base-graphs") to rerun the runs that failed.
  for run in ${GPU_CHECK_RUNS:-base recipe big base-graphs}; do
    case $run in
      base) preset=base limit=160
        extra=(--variant "compiled loss" loss.kernel=compiled "${liger[@]}"
          --variant layers compile=layers) ;;
      recipe) preset=recipe limit=130
        extra=(--no-peers --variant layers compile=layers "${graphs8[@]}") ;;
      big) preset=big limit=70 extra=() ;;
      base-graphs) preset=base limit=100
        extra=(--no-peers --variant compiled compile=true "${graphs4[@]}") ;;
      *) record "bench_train $run" FAIL 0 "unknown run (base, recipe, big, base-graphs)"
        continue ;;
    esac
    # (a dry run: big and base-graphs would repeat base's and recipe's tiny work; composed only)
    local options=("${common[@]}")
    ((DRY)) && [[ $run == big || $run == base-graphs ]] && options=("${compose[@]}")
    bench_run "$bench" "$run" "$preset" "$limit" "$WORK/step_$run.json" \
      "${options[@]}" "${extra[@]}"
    merged+=("$run=$WORK/step_$run.json")
  done
  "${HELP[@]}" merge-json "$OUT_DIR/step_runs.json" "${merged[@]}" >>"$bench" 2>&1 || true
  # The CUDA tests of those options: each loss kernel against float32 cross entropy, the layers
  # compiled by inductor against eager, the fused loss and the step on CUDA, training on CUDA
  # graphs against eager (two inductor compilations: 120 s, not 60).
  local pytest=(-q -ra -p no:cacheprovider -m cuda tests/training/test_loss.py
    tests/training/test_lit_module.py tests/training/test_cuda_training.py)
  ((DRY)) && pytest+=(--collect-only)
  run_step 120 "$tests" "$PY" -m pytest "${pytest[@]}"
  record "pytest step options" "$STATUS" "$LAST_SECONDS" "$(pytest_result "$tests")"
}

# ---------------------------------------------------------------------------------------------
# Stage recipe: the Multi30k GPU recipe, resumable across calls, then its evaluation.

EVAL_RESERVE=75   # three evaluate.py runs on the GPU (load, beam 5, score), with margin
STARTUP_RESERVE=45  # train.py before training starts (imports, data, sanity check)

stage_recipe() {
  local log=$OUT_DIR/recipe.log run=$WORK/recipe max_steps=12000 max_calls=1
  # A dry run trains 6 updates (2 epochs of 3) in two calls, the first cut after 4, inside the
  # second epoch (as the call's time limit cuts a real one): the resume runs too, and the
  # averaged epochs span it, as the real recipe's last 10 do when a second call trains fewer.
  ((DRY)) && max_steps=6 max_calls=2
  : >"$log"
  begin_stage
  echo "# gpu_check stage recipe, $(date -u +%FT%TZ), dry_run=$DRY, run dir $run" >>"$log"

  local calls=0 finished=False info=$TMP/recipe.info train_failed=0
  while :; do
    if [[ -f $run/checkpoints/last.ckpt ]]; then
      "${HELP[@]}" run-info "$run" --max-steps "$max_steps" >"$info" 2>>"$log" || true
      finished=$(kv finished "$info")
    fi
    [[ $finished == True ]] && break
    ((calls < max_calls)) || break
    local budget=$(($(remaining) - EVAL_RESERVE - STARTUP_RESERVE))
    if ((budget < 60)) && ((!DRY)); then
      record "recipe train" skip 0 "only ${budget}s of the stage budget left for training"
      break
    fi
    ((DRY)) && budget=600
    local resume=() steps=() n
    ((DRY)) && steps=("trainer.max_steps=$max_steps")
    if [[ -f $run/checkpoints/last.ckpt ]]; then
      resume=("ckpt_path=$run/checkpoints/last.ckpt")
    else
      rm -rf "$run"  # no checkpoint to resume: start clean
      mkdir -p "$run"
      ((DRY)) && steps=(trainer.max_steps=4)
    fi
    n=$(($(find "$run" -maxdepth 1 -name 'fit-profile_call*.txt' | wc -l) + 1))
    calls=$((calls + 1))
    # The recipe exactly as transformer/configs/experiment/multi30k_en_de.yaml has it (attention maps on),
    # plus: csv logs, no progress bar (a readable log), and Lightning's simple profiler written
    # to a file (per-hook times: the attention maps' cost among them). No trainer.max_time: the
    # schedule decays over the recipe's updates, and a time limit would end it within the call.
    # At the call's time limit `timeout` sends SIGTERM instead: train.py finishes the update,
    # writes last.ckpt and stops, and the next call resumes it.
    local limit=$((budget + STARTUP_RESERVE))
    run_step "$limit" "$log" "$PY" train.py experiment=multi30k_en_de \
      "data.root=$DATA" data.download=false logger=csv "hydra.run.dir=$run" \
      trainer.enable_progress_bar=false \
      +trainer.profiler._target_=lightning.pytorch.profilers.SimpleProfiler \
      "+trainer.profiler.dirpath=$run" "+trainer.profiler.filename=profile_call$n" \
      "${resume[@]}" "${steps[@]}" "${DRY_TRAIN[@]}"
    local stopped=0
    if [[ $STATUS == timeout ]] && grep -q "^error: SIGTERM at step" <(last_section "$log"); then
      STATUS=ok stopped=1  # stopped at the limit with last.ckpt written: to be resumed
    fi
    "${HELP[@]}" record-call "$run" "call=$n" "seconds=$LAST_SECONDS" "exit_status=$RC" \
      "resumed=$((${#resume[@]} > 0))" "time_limit_s=$limit" "stopped_at_limit=$stopped" \
      "started_utc=\"$(date -u +%FT%TZ)\"" 2>>"$log" || true
    "${HELP[@]}" run-info "$run" --max-steps "$max_steps" --log "$log" >"$info" 2>&1 || true
    cat "$info" >>"$log"
    finished=$(kv finished "$info")
    local what="fresh"
    ((${#resume[@]})) && what="resumed from last.ckpt"
    ((stopped)) && what+=", stopped at the time limit"
    [[ $STATUS == ok ]] || what+=": $(failure_note "$log")"
    record "recipe train (call $n)" "$STATUS" "$LAST_SECONDS" "$what (${limit}s): step $(kv global_step "$info")/$max_steps, epoch $(kv epoch "$info"), val/bleu $(kv val_bleu_last "$info"), finished=$finished"
    [[ $STATUS == ok ]] || { train_failed=1; break; }
  done

  # The last 10 complete epochs averaged (the recipe), beam 5 (evaluate.py's default), on the
  # three test sets; if training is not finished, test_2016_flickr alone on what there is, so
  # that a call that cannot be resumed still leaves a number.
  local splits=(test_2016_flickr test_2017_flickr test_2017_mscoco) ckpt
  [[ $finished == True ]] || splits=(test_2016_flickr)
  if compgen -G "$run/checkpoints/epochs/*.ckpt" >/dev/null; then
    ckpt="'$run/checkpoints/epochs/*.ckpt'"
  elif [[ -f $run/checkpoints/last.ckpt ]]; then
    ckpt=$run/checkpoints/last.ckpt
  else
    record "recipe evaluate" skip 0 "no checkpoint"
    splits=()
  fi
  local split
  for split in "${splits[@]}"; do
    mkdir -p "$run/eval/$split"
    run_step 150 "$log" "$PY" evaluate.py "ckpt_path=$ckpt" "data.root=$DATA" "split=$split" \
      "hydra.run.dir=$run/eval/$split"
    echo "$LAST_SECONDS" >"$run/eval/$split/wall_seconds"
    local note
    if [[ $STATUS == ok ]]; then
      note=$("${HELP[@]}" note eval "$run/eval/$split/metrics.json")
    else
      note=$(failure_note "$log")
    fi
    [[ $finished == True ]] || note="PARTIAL (training not finished): $note"
    record "evaluate $split" "$STATUS" "$LAST_SECONDS" "$note"
  done
  "${HELP[@]}" recipe-metrics "$run" "$OUT_DIR/recipe_metrics.json" --max-steps "$max_steps" \
    >>"$log" 2>&1 || record "recipe metrics" FAIL 0 "see recipe.log"
  if [[ $finished != True ]] && ((!train_failed)); then
    record "recipe" warn 0 "NOT FINISHED: run stage recipe again at once (machine still warm) to resume from $run/checkpoints/last.ckpt"
  fi
}

# ---------------------------------------------------------------------------------------------

# The summary table, printed last (the end of stdout comes back from the GPU tool); exit 1 if
# a step failed or timed out.
finish() {
  local table files
  table=$("${HELP[@]}" summary "$STEPS" --out "$OUT_DIR/summary.txt" 2>&1) || true
  shopt -s nullglob
  files=("$OUT_DIR"/*)
  echo
  echo "gpu_check: ${#files[@]} files in $OUT_DIR: ${files[*]##*/}"
  echo "$table"
  echo
  cat "$OUT_DIR/results.md" 2>/dev/null || true  # last: the tables for docs/benchmarks.md
  # (awk, not grep -q: an early exit would break the pipe and read as "nothing failed")
  if awk -F'\t' '$3 !~ /^(ok|warn|skip)$/ {bad = 1} END {exit bad}' "$STEPS"; then
    exit 0
  fi
  exit 1
}

stages=("$STAGE")
[[ $STAGE == all ]] && stages=(1 2 3 step recipe)
: >"$OUT_DIR/results.md"
for s in "${stages[@]}"; do
  CUR=$s
  STAGE_START=$SECONDS
  case $s in
    1) stage1 ;;
    2) stage2 ;;
    3) stage3 ;;
    step) stage_step ;;
    recipe) stage_recipe ;;
  esac
  "${HELP[@]}" report "$s" "$OUT_DIR" --commit "$COMMIT" >/dev/null 2>>"$OUT_DIR/summary.txt" ||
    record report FAIL 0 "gpu_check.py report $s failed (summary.txt)"
done
finish
