#!/usr/bin/env bash
# How many heads? The CPU Multi30k recipe trained at equal budgets (the same number of updates)
# over model.num_heads=1,2,4,8 at d_model 256, and over model.num_kv_heads=1,2 (grouped-query) at
# 4 heads; then each run's last.ckpt is scored (test_2016_flickr, beam 5), its heads ranked
# (analysis=heads, gradient importance) and labelled (analysis=maps, roles), and
# dev/how_many_heads_report.py gathers one table and one figure.
#
#   bash dev/how_many_heads.sh DATA_ROOT OUT [STEPS]     # e.g. ../shared/data/multi30k outputs/heads 1200
#
# Equal updates rather than equal wall time: a shared machine's speed moves 10-25% between runs,
# and the four head counts do the same matrix work at a fixed width. Each run's wall time is
# reported beside its BLEU. The schedule decays linearly to zero at STEPS (optim=adamw_linear), so
# that no run is judged while its learning rate is still hot.
set -euo pipefail
DATA=$(realpath "$1")
OUT=$(realpath -m "$2")
STEPS=${3:-1200}
# float32 as measured (README); the recipe's precision=auto would pick bf16-mixed on bf16 CPUs
COMMON=(experiment=multi30k_en_de_cpu "data.root=$DATA" logger=csv optim=adamw_linear
        optim.scheduler.warmup_steps=300 trainer.max_time=null "trainer.max_steps=$STEPS"
        trainer.precision=32-true)

python train.py -m "${COMMON[@]}" model.num_heads=1,2,4,8 "hydra.sweep.dir=$OUT/heads"
python train.py -m "${COMMON[@]}" model.num_heads=4 model.num_kv_heads=1,2 "hydra.sweep.dir=$OUT/kv"

for run in "$OUT"/heads/* "$OUT"/kv/*; do
    [ -f "$run/checkpoints/last.ckpt" ] || continue
    ckpt=$run/checkpoints/last.ckpt
    python evaluate.py "ckpt_path=$ckpt" "data.root=$DATA" split=test_2016_flickr \
        "hydra.run.dir=$run/eval_test_2016_flickr"
    python evaluate.py "ckpt_path=$ckpt" "data.root=$DATA" split=val analysis=heads \
        analysis_options.importance=gradient "hydra.run.dir=$run/analysis_heads"
    python evaluate.py "ckpt_path=$ckpt" "data.root=$DATA" split=val analysis=maps \
        "hydra.run.dir=$run/analysis_maps"
done
python dev/how_many_heads_report.py "$OUT"
