#!/usr/bin/env bash
# The recipe end to end: CPT -> SFT stage 1 -> SFT stage 2 -> eval, for one or more precisions, then the
# FP8-vs-BF16 report. Re-running the same command after a crash, a kill or a time limit goes on where it
# stopped: a stage whose summary.json says "finished" is skipped, an unfinished one is started again on
# the same run dir and infir-train resumes it from its last checkpoint; eval is skipped once its
# summary.json exists.
#
#   launch/pipeline.sh                                   # the demo: tiny model, bf16 and fp8_blockwise_ue8m0, CPU, minutes
#   launch/pipeline.sh --precision bf16,fp8_blockwise_ue8m0 --model qwen2.5-1.5b --scale full --nproc 8 \
#       --eval-preset reference -- parallel=tp2
#
# Options:
#   --precision LIST   comma-separated conf/precision options, each a full pipeline (default: bf16,fp8_blockwise_ue8m0;
#                      the report compares each with bf16)
#   --model NAME       conf/model option (default: tiny)
#   --scale NAME       conf/scale option: demo (2-core sizes) or full (the paper's) (default: demo)
#   --out DIR          where the runs go: DIR/<model>-<precision>/{cpt,sft1,sft2,eval}, DIR/report (default: outputs/pipeline)
#   --nproc N          ranks per stage; N > 1 goes through launch/torchrun.sh (default: 1, plain process)
#   --eval-preset NAME conf/eval option for the eval stage (default: demo)
#   -- OVERRIDES...    passed to every infir-train stage (e.g. parallel=tp2 train.log_interval=1)
# Environment: INFIR_TRAIN / INFIR_EVAL / INFIR_COMPARE replace the commands (default infir-train,
# infir-eval, infir-compare); with --nproc > 1 the launch/lib.sh settings apply. OMP_WAIT_POLICY defaults
# to PASSIVE: torch's OpenMP threads then sleep instead of spinning while they wait; on CPU cores that
# other jobs share, a spinning thread holds the core the thread it waits for needs.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

precisions="bf16,fp8_blockwise_ue8m0" model="tiny" scale="demo" out="outputs/pipeline" nproc=1 eval_preset="demo"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --precision) precisions="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --scale) scale="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --nproc) nproc="$2"; shift 2 ;;
    --eval-preset) eval_preset="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "pipeline.sh: unknown option '$1' (see --help; infir-train overrides go after --)" >&2; exit 2 ;;
  esac
done
read -r -a train_cmd <<< "${INFIR_TRAIN:-infir-train}"
read -r -a eval_cmd <<< "${INFIR_EVAL:-infir-eval}"
read -r -a compare_cmd <<< "${INFIR_COMPARE:-infir-compare}"

say() { echo "pipeline: $*" >&2; }

status_of() {  # the status field of a run dir's summary.json, or "absent"
  local summary="$1/summary.json"
  [[ -f "$summary" ]] || { echo absent; return; }
  "${PYTHON:-python}" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("status", "unknown"))' "$summary"
}

train_stage() {  # train_stage STAGE RUN_DIR [infir-train overrides...]
  local stage="$1" run_dir="$2"; shift 2
  local status; status="$(status_of "$run_dir")"
  if [[ "$status" == finished ]]; then
    say "$stage: finished earlier in $run_dir, skipped"
    return
  fi
  [[ "$status" == absent ]] && say "$stage: starting in $run_dir" || say "$stage: was '$status', resuming in $run_dir"
  local args=("model=$model" "precision=$precision" "stage=$stage" "scale=$scale" "run_dir=$run_dir" "$@")
  if (( nproc > 1 )); then
    INFIR_CMD="${train_cmd[*]}" NPROC_PER_NODE="$nproc" INFIR_LOG_DIR="$run_dir/logs" "$here/torchrun.sh" "${args[@]}"
  else
    "${train_cmd[@]}" "${args[@]}"
  fi
  status="$(status_of "$run_dir")"
  if [[ "$status" != finished ]]; then  # e.g. train.exit_after or a time limit: a clean stop, not the end
    say "$stage stopped with status '$status' in $run_dir; run the same command again to resume it"
    exit 3
  fi
}

for precision in ${precisions//,/ }; do
  variant="$out/$model-$precision"
  say "== $model $precision -> $variant"
  train_stage cpt "$variant/cpt" "$@"
  train_stage sft1 "$variant/sft1" "init_from=$variant/cpt/checkpoints" "$@"
  train_stage sft2 "$variant/sft2" "init_from=$variant/sft1/checkpoints" "$@"
  if [[ -f "$variant/eval/summary.json" ]]; then
    say "eval: done earlier in $variant/eval, skipped"
  else
    say "eval: $variant/sft2 -> $variant/eval"
    "${eval_cmd[@]}" run "model=$variant/sft2/checkpoints" "preset=$eval_preset" "out_dir=$variant/eval" \
      "label=$model-$precision"
  fi
done

"${compare_cmd[@]}" "$out" --out "$out/report"
say "done: report in $out/report/index.html"
