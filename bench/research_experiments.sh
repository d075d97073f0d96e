#!/usr/bin/env bash
# Issue 22's experiments on Multi30k, each against its baseline in the same conditions (equal
# updates, the CPU recipe's settings otherwise), results in README "Research workflows":
#
#   bash bench/research_experiments.sh distill DATA OUT TEACHER [STEPS]
#       sequence-level distillation (Kim & Rush 2016): TEACHER (a checkpoint) translates the
#       training sources with beam 5; a student smaller than model=mini (2+2 layers) trains on
#       its output and, as the baseline, on the references
#
# Run from the repository root. DATA: the raw Multi30k files (e.g. ../shared/data/multi30k).
# Each step is skipped when its result exists, so a cut run continues where it stopped. STEPS:
# updates per training (1500).
set -euo pipefail

usage="usage: $0 distill DATA OUT TEACHER [STEPS]"
[ $# -ge 3 ] || { echo "$usage" >&2; exit 2; }
what=$1 data=$(realpath "$2") out=$(mkdir -p "$3" && realpath "$3")
python=${PYTHON:-python}

# corpus DIR TRAIN_SRC TRAIN_TGT: a local corpus of these training files and Multi30k's val/tests
corpus() {
    mkdir -p "$1"
    ln -sf "$2" "$1/train.en"
    ln -sf "$3" "$1/train.de"
    for split in val test_2016_flickr test_2017_flickr test_2017_mscoco; do
        for lang in en de; do ln -sf "$data/$split.$lang.gz" "$1/$split.$lang.gz"; done
    done
}

# student NAME CORPUS STEPS MODEL...: train on the corpus, then score last.ckpt and the epochs' average
student() {
    local run=$out/$1 corpus=$2 steps=$3
    shift 3
    if [ ! -f "$run/checkpoints/last.ckpt" ]; then
        $python train.py experiment=multi30k_en_de_cpu data=local "data.root=$corpus" \
            data.val_split=val data.test_split=test_2016_flickr "data.cache_dir=$run/cache" \
            optim=adamw_linear optim.scheduler.warmup_steps=300 "trainer.max_steps=$steps" \
            '~trainer.max_time' logger=csv "hydra.run.dir=$run" trainer.enable_progress_bar=false \
            "$@"
    fi
    # last.ckpt (the end of the linear decay), and the average of the last 10 epochs
    for split in test_2016_flickr test_2017_flickr test_2017_mscoco val; do
        [ -f "$run/evallast_$split/metrics.json" ] ||
            $python evaluate.py "ckpt_path=$run/checkpoints/last.ckpt" "split=$split" \
                "hydra.run.dir=$run/evallast_$split"
        [ -f "$run/eval_$split/metrics.json" ] ||
            $python evaluate.py "ckpt_path='$run/checkpoints/epochs/*.ckpt'" "split=$split" \
                "hydra.run.dir=$run/eval_$split"
    done
}

case $what in
distill)
    [ $# -ge 4 ] || { echo "$usage" >&2; exit 2; }
    teacher=$(realpath "$4") steps=${5:-1500}
    zcat "$data/train.en.gz" > "$out/train.en"
    zcat "$data/train.de.gz" > "$out/train.de"
    if [ ! -s "$out/train.distilled.de" ]; then  # evaluate.py resumes a cut translation
        $python evaluate.py "ckpt_path=$teacher" "input=$out/train.en" \
            "output=$out/train.distilled.part" "hydra.run.dir=$out/teacher"
        mv "$out/train.distilled.part" "$out/train.distilled.de"
    fi
    corpus "$out/references" "$out/train.en" "$out/train.de"
    corpus "$out/distilled" "$out/train.en" "$out/train.distilled.de"
    small=(model=mini model.num_encoder_layers=2 model.num_decoder_layers=2)
    student student_references "$out/references" "$steps" "${small[@]}"
    student student_distilled "$out/distilled" "$steps" "${small[@]}"
    ;;
*)
    echo "$usage" >&2
    exit 2
    ;;
esac
