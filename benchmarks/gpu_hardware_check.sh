#!/usr/bin/env bash
# Real-GPU check for `rentwise doctor`, `bench` and `watch` (issue 6). Needs one CUDA GPU, an NVIDIA driver,
# and `pip install -e '.[gpu,train]'`. Estimated 4 minutes; the step timeouts add up to 7 min 50 s at worst.
#
# Writes to benchmarks/results/gpu-check-<gpu>-<utc time>/ (and copies that folder to $OUT when set):
#   nvidia-smi.txt, nvidia-smi-q.txt     what the driver says, for cross-checking rentwise's readings
#   doctor.txt, doctor.json              `rentwise doctor --for train`
#   bench.txt, bench.json                `rentwise bench --save` (achieved TFLOPS / GB/s as % of catalog peaks)
#   bench-again.txt, bench-again.json    a second run with `--compare bench.json` (run-to-run repeatability)
#   watch-train.txt/.json/.jsonl         `rentwise watch --record` around a ~75 s bf16 training job
#   watch-idle.txt/.jsonl                15 s of an idle GPU
#   gpu-tests.txt                        the @pytest.mark.gpu tests
#   summary.md                           the figures above in one table
# and copies the two recorded traces to tests/fixtures/machine/recorded-<gpu>-{train,idle}.jsonl, so that the
# advice rules are also tested on real NVML readings (commit them together with the results folder).
set -uo pipefail

cd "$(dirname "$0")/.."
if [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi
command -v nvidia-smi >/dev/null || { echo "gpu_hardware_check: nvidia-smi not found: no NVIDIA driver here" >&2; exit 1; }
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "gpu_hardware_check: torch sees no CUDA GPU; run rentwise doctor" >&2; exit 1; }

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -1)
SLUG=$(echo "$GPU_NAME" | tr '[:upper:]' '[:lower:]' | sed -E 's/^nvidia //; s/[^a-z0-9]+/-/g; s/-+$//')
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RESULTS="benchmarks/results/gpu-check-$SLUG-$STAMP"
FIXTURES=tests/fixtures/machine
mkdir -p "$RESULTS"
echo "gpu_hardware_check: $GPU_NAME -> $RESULTS" >&2
START=$SECONDS

step() {  # step NAME TIMEOUT_S COMMAND...: run with a time limit, keep its exit code in $RESULTS/NAME.rc
  local name=$1 limit=$2; shift 2
  echo "== $name ($(( SECONDS - START )) s elapsed)" >&2
  timeout "$limit" "$@"; local rc=$?
  echo "$rc" > "$RESULTS/$name.rc"
  return 0
}

nvidia-smi > "$RESULTS/nvidia-smi.txt" 2>&1
nvidia-smi -q > "$RESULTS/nvidia-smi-q.txt" 2>&1

step doctor 60 bash -c "rentwise doctor --for train > '$RESULTS/doctor.txt' 2>&1; \
  rentwise doctor --for train --json > '$RESULTS/doctor.json' 2>/dev/null"

step bench 90 bash -c "rentwise bench --save '$RESULTS/bench.json' > '$RESULTS/bench.txt' 2>&1"
step bench-again 90 bash -c "rentwise bench --compare '$RESULTS/bench.json' --save '$RESULTS/bench-again.json' \
  > '$RESULTS/bench-again.txt' 2>&1"

# A short real training job to watch: a ~0.3B-parameter Llama-shaped model from a config (no download),
# bf16 autocast, AdamW, random tokens, for 75 seconds.
cat > "$RESULTS/train_probe.py" <<'PY'
import time
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
                     num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
model = LlamaForCausalLM(config).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
batch, seq = 8, 1024
end = time.monotonic() + 75
step = 0
while time.monotonic() < end:
    tokens = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
torch.cuda.synchronize()
print(f"steps={step} loss={loss.item():.3f} max_allocated_gib={torch.cuda.max_memory_allocated() / 2**30:.2f} "
      f"max_reserved_gib={torch.cuda.max_memory_reserved() / 2**30:.2f}")
PY
step watch-train 150 bash -c "rentwise watch --interval 1 --record '$RESULTS/watch-train.jsonl' \
  -- python '$RESULTS/train_probe.py' > '$RESULTS/watch-train.txt' 2>&1"
rentwise watch --replay "$RESULTS/watch-train.jsonl" --json > "$RESULTS/watch-train.json" 2>/dev/null
step watch-idle 30 bash -c "rentwise watch --interval 1 --duration 15 --record '$RESULTS/watch-idle.jsonl' \
  > '$RESULTS/watch-idle.txt' 2>&1"

step gpu-tests 50 bash -c "python -m pytest -m gpu tests/unit/machine -q -p no:cacheprovider \
  > '$RESULTS/gpu-tests.txt' 2>&1"

cp "$RESULTS/watch-train.jsonl" "$FIXTURES/recorded-$SLUG-train.jsonl" 2>/dev/null
cp "$RESULTS/watch-idle.jsonl" "$FIXTURES/recorded-$SLUG-idle.jsonl" 2>/dev/null

python - "$RESULTS" <<'PY' > "$RESULTS/summary.md"
import json, sys
from pathlib import Path

results = Path(sys.argv[1])
print(f"# GPU hardware check: {results.name}\n")
def rc(name):
    path = results / f"{name}.rc"
    return path.read_text().strip() if path.exists() else "not run"
print("| step | exit code |\n|---|---|")
for name in ("doctor", "bench", "bench-again", "watch-train", "watch-idle", "gpu-tests"):
    print(f"| {name} | {rc(name)} |")
for name in ("bench.json", "bench-again.json"):
    path = results / name
    if not path.exists():
        continue
    document = json.loads(path.read_text())
    verdict = document["verdict"]
    print(f"\n## {name}: verdict **{verdict['status']}** (catalog: {document['catalog_gpu']})\n")
    print("| measurement | median | spread | catalog peak | % of peak |\n|---|---|---|---|---|")
    for c in verdict["comparisons"]:
        peak = f"{c['peak']:.0f}" if c["peak"] else "-"
        fraction = f"{c['fraction']:.1%}" if c["fraction"] is not None else "-"
        print(f"| {c['name']} | {c['achieved']:.1f} {c['unit']} | {c['spread']:.1%} | {peak} | {fraction} |")
    for reason in verdict["reasons"]:
        print(f"- {reason}")
watch = results / "watch-train.json"
if watch.exists():
    summary = json.loads(watch.read_text())
    print(f"\n## watch around the training job: {summary['sample_count']} samples, {summary['duration_s']:.0f} s\n")
    for gpu in summary["gpus"]:
        job = f"{gpu['job_peak_bytes'] / 2**30:.2f} GiB" if gpu["job_peak_bytes"] is not None else "not attributed"
        util = f"{gpu['mean_utilization_pct']:.0f}%" if gpu["mean_utilization_pct"] is not None else "-"
        print(f"- GPU {gpu['index']} {gpu['name']}: peak {gpu['peak_used_bytes'] / 2**30:.2f} GiB of "
              f"{gpu['total_bytes'] / 2**30:.2f} GiB, job peak {job}, mean util {util}, "
              f"idle {gpu['idle_s']:.0f} s, throttled {gpu['throttled_s']:.0f} s")
    for advice in summary["advice"]:
        print(f"- advice [{advice['rule']}]: {advice['message']} -> {advice['action']}")
probe = results / "watch-train.txt"
if probe.exists():
    lines = [line for line in probe.read_text().splitlines() if line.startswith("steps=")]
    if lines:
        print(f"\ntraining probe: {lines[-1]}")
PY

echo "== done in $(( SECONDS - START )) s" >&2
cat "$RESULTS/summary.md"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/results" && cp -r "$RESULTS" "$OUT/results/"
  mkdir -p "$OUT/fixtures" && cp "$FIXTURES"/recorded-"$SLUG"-*.jsonl "$OUT/fixtures/" 2>/dev/null
fi
