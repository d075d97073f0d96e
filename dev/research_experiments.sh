#!/usr/bin/env bash
# Issue 22's experiments on Multi30k, each against its baseline in the same conditions (equal
# updates, the CPU recipe's settings otherwise), results in README "Research workflows":
#
#   bash dev/research_experiments.sh distill DATA OUT TEACHER [STEPS]
#       sequence-level distillation (Kim & Rush 2016): TEACHER (a checkpoint) translates the
#       training sources with beam 5; a student smaller than model=mini (2+2 layers) trains on
#       its output and, as the baseline, on the references
#   bash dev/research_experiments.sh backtranslation DATA OUT [STEPS]
#       back-translation (Sennrich et al. 2016; sampled: Edunov et al. 2018; tagged: Caswell et
#       al. 2019): de->en trains on the first half of the training pairs and translates the
#       German of the second half, with beam 5 and by sampling; en->de trains on the first half
#       alone (the baseline) and on it plus each back-translation, tagged <bt> and untagged
#   bash dev/research_experiments.sh multilingual DATA OUT [STEPS]
#       one model en->{de,fr,cs} with target tokens (3 x STEPS updates) against three bilingual
#       models (STEPS each): the same size and, in all, the same updates
#
# Run from the repository root. DATA: the raw Multi30k files (e.g. ../shared/data/multi30k).
# Each step is skipped when its result exists, so a cut run continues where it stopped. STEPS:
# updates per training (1500).
set -euo pipefail

usage="usage: $0 distill DATA OUT TEACHER [STEPS] | backtranslation DATA OUT [STEPS] | multilingual DATA OUT [STEPS]"
[ $# -ge 3 ] || { echo "$usage" >&2; exit 2; }
what=$1 data=$(realpath "$2") out=$(mkdir -p "$3" && realpath "$3")
python=${PYTHON:-python}

# corpus DIR TRAIN_EN TRAIN_DE: a local corpus of these training files and Multi30k's val/tests
corpus() {
    mkdir -p "$1"
    ln -sf "$2" "$1/train.en"
    ln -sf "$3" "$1/train.de"
    for split in val test_2016_flickr test_2017_flickr test_2017_mscoco; do
        for lang in en de; do ln -sf "$data/$split.$lang.gz" "$1/$split.$lang.gz"; done
    done
}

# fit NAME STEPS OPTION...: train (the CPU recipe, adamw_linear, STEPS updates, float32 as
# measured) unless done
fit() {
    local run=$out/$1 steps=$2
    shift 2
    [ -f "$run/checkpoints/last.ckpt" ] && return
    $python train.py experiment=multi30k_en_de_cpu "data.cache_dir=$run/cache" \
        optim=adamw_linear optim.scheduler.warmup_steps=300 "trainer.max_steps=$steps" \
        trainer.precision=32-true \
        '~trainer.max_time' logger=csv "hydra.run.dir=$run" trainer.enable_progress_bar=false "$@" \
        ${EXTRA:-}  # e.g. EXTRA="model=tiny data.vocab_size=64": a quick dry run
}

# score NAME SPLITS SUFFIX OPTION...: beam 5 on each split, of last.ckpt (evallast_SPLIT): a
# linear decay ends cool, and averaging its epochs costs BLEU (README, distillation)
score() {
    local run=$out/$1 splits=$2 suffix=$3
    shift 3
    for split in $splits; do
        [ -f "$run/evallast_$split$suffix/metrics.json" ] ||
            $python evaluate.py "ckpt_path=$run/checkpoints/last.ckpt" "split=$split" \
                "hydra.run.dir=$run/evallast_$split$suffix" "$@"
    done
}

tests="test_2016_flickr test_2017_flickr test_2017_mscoco val"
local_data=(data=local data.val_split=val data.test_split=test_2016_flickr)

# student NAME CORPUS STEPS MODEL...: en->de on a local corpus, scored on Multi30k's tests
student() {
    local name=$1 corpus=$2 steps=$3
    shift 3
    fit "$name" "$steps" "${local_data[@]}" "data.root=$corpus" "$@"
    score "$name" "$tests" ""
}

# translate CKPT INPUT OUTPUT OPTION...: evaluate.py input=INPUT (it resumes a cut run)
translate() {
    [ -s "$3" ] && return
    $python evaluate.py "ckpt_path=$1" "input=$2" "output=$3.part" \
        "hydra.run.dir=$(dirname "$3")/translate_$(basename "$3")" "${@:4}"
    mv "$3.part" "$3"
}

case $what in
distill)
    [ $# -ge 4 ] || { echo "$usage" >&2; exit 2; }
    teacher=$(realpath "$4") steps=${5:-1500}
    zcat "$data/train.en.gz" > "$out/train.en"
    zcat "$data/train.de.gz" > "$out/train.de"
    translate "$teacher" "$out/train.en" "$out/train.distilled.de"
    corpus "$out/references" "$out/train.en" "$out/train.de"
    corpus "$out/distilled" "$out/train.en" "$out/train.distilled.de"
    small=(model=mini model.num_encoder_layers=2 model.num_decoder_layers=2)
    student student_references "$out/references" "$steps" "${small[@]}"
    student student_distilled "$out/distilled" "$steps" "${small[@]}"
    ;;
backtranslation)
    steps=${4:-1500}
    for lang in en de; do
        zcat "$data/train.$lang.gz" > "$out/all.$lang"
        half=$(($(wc -l < "$out/all.$lang") / 2))
        head -n "$half" "$out/all.$lang" > "$out/half.$lang"
        tail -n +"$((half + 1))" "$out/all.$lang" > "$out/second.$lang"  # its de: monolingual
    done
    corpus "$out/half" "$out/half.en" "$out/half.de"
    fit de_en_half "$steps" "${local_data[@]}" "data.root=$out/half" data.src_lang=de \
        data.tgt_lang=en
    score de_en_half test_2016_flickr ""
    de_en=$out/de_en_half/checkpoints/last.ckpt
    translate "$de_en" "$out/second.de" "$out/bt_beam.en"
    translate "$de_en" "$out/second.de" "$out/bt_sample.en" decode=sample
    student en_de_half "$out/half" "$steps"
    for bt in beam sample; do
        corpus "$out/bt_$bt" "$out/bt_$bt.en" "$out/second.de"
        student "en_de_bt_$bt" "$out/half" "$steps" "data.corpora=[{},{root:'$out/bt_$bt'}]"
        student "en_de_bt_${bt}_tagged" "$out/half" "$steps" \
            "data.corpora=[{},{root:'$out/bt_$bt',tag:'<bt>'}]"
    done
    ;;
multilingual)
    steps=${4:-1500}
    for lang in de fr cs; do
        fit "bilingual_en_$lang" "$steps" "data.root=$data" "data.tgt_lang=$lang"
        score "bilingual_en_$lang" test_2016_flickr "" "data.root=$data"
    done
    fit multilingual "$((3 * steps))" "data.root=$data" data.target_token=true \
        "data.corpora=[{tgt_lang:de},{tgt_lang:fr},{tgt_lang:cs}]"
    for lang in de fr cs; do
        score multilingual test_2016_flickr "_en-$lang" "data.root=$data" "direction=en-$lang"
    done
    ;;
*)
    echo "$usage" >&2
    exit 2
    ;;
esac
