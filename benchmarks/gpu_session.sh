#!/usr/bin/env bash
# One GPU session's work, step by step (each step fits one device run of at most 10 minutes).
# Run from the repository root on the GPU machine, with $OUT set:
#
#   bash benchmarks/gpu_session.sh setup       # onnxruntime-gpu from /tmp/ort (its parts copied there first), lark from .whl/
#   bash benchmarks/gpu_session.sh decisions   # measure the cost table (decisions_bench.py), merge it, then the zoo's first half
#   bash benchmarks/gpu_session.sh precision   # the precision decision's entries (fp16 vs fp32 convolutions, casts included), merged (< 3 min)
#   bash benchmarks/gpu_session.sh precision-rnn  # the recurrent ops' precision entries (LSTM/GRU fp16 vs fp32, casts included), merged (< 4 min)
#   bash benchmarks/gpu_session.sh zoo 2/2     # the zoo's second half (or 1/1 for all)
#   bash benchmarks/gpu_session.sh torch       # torch.compile: graphopt against inductor on the issue-15 models
#   bash benchmarks/gpu_session.sh torch-modes M  # one model (llama, t5, convnext): default, reduce-overhead, max-autotune, each against inductor's
#   bash benchmarks/gpu_session.sh train       # training steps through the backend against inductor (torch_train.py); "train-dist": DDP and FSDP2 on all GPUs
#   bash benchmarks/gpu_session.sh torch-kernels M # one model (default t5): default and reduce-overhead against inductor's, with GPU kernel profiles
#   bash benchmarks/gpu_session.sh torch-cost M,N # graphopt's passes against inductor's compile time (torch_compile_cost.py)
#   bash benchmarks/gpu_session.sh torch-zoo SHARD MODES DTYPES [MODELS]  # issue 15's evidence: every torch model of the zoo
#                                              # (33, benchmarks/torch_zoo.py --list), graphopt against inductor per mode, interleaved
#                                              # rounds, ties/losses re-measured; SHARD i/n takes every n-th model. No model starts after
#                                              # the budget (400 s; 330 s with max-autotune), so the slowest model still ends within the
#                                              # 560 s timeout; the JSON's not_started names the rest (run them again with MODELS).
#                                              # Estimate (tiny 2-layer models, inductor caches off): default + reduce-overhead, one dtype
#                                              # ~60-90 s a model, 5-6 a call; max-autotune ~120-150 s a model, ~3 a call. Shard plan:
#                                              #   torch-zoo 1/6 default,reduce-overhead fp16   ... 6/6   (6 calls, then the same in bf16)
#                                              #   torch-zoo 1/11 max-autotune fp16             ... 11/11 (11 calls, then bf16)
#   bash benchmarks/gpu_session.sh t5-attention  # issue 15: T5's SDPA mask (< 4 min): eager SDPA probes (packed or separate q/k/v,
#                                              # efficient / cuDNN / default backend), then T5-base 2 and 12 layers fp16 b8 s128
#                                              # through inductor and graphopt with each attention_mask handling; every case in its
#                                              # own process (a CUDA error is one FAILED line, re-run with CUDA_LAUNCH_BLOCKING=1)
#   bash benchmarks/gpu_session.sh profile M,N # the ops onnxruntime runs and the kernels they launch, per variant (ort_profile.py)
#   bash benchmarks/gpu_session.sh norm14      # tf-transformer and jax-vit in fp16 (issue 14's two fp16 losses): the original, onnxruntime's
#                                              # fp16 converter, graphopt fp16, graphopt fp16 with Softmax kept in fp32 (the old default)
#                                              # and without the LayerNorm rules that fuse their norms (ort_profile.py), then both in
#                                              # zoo_bench against the anchors (< 4 minutes)
#   bash benchmarks/gpu_session.sh zoo-recheck M,N  # flagged models again: CUDA, launching thread pinned, the original timed
#                                              # twice, files onnxruntime runs as one graph timed once; "zoo-recheck cpu M,N": CPU provider
#   bash benchmarks/gpu_session.sh cpu 1/1     # the zoo on onnxruntime's CPU provider (the GPU machine's 16 cores, 4 threads a session)
#   bash benchmarks/gpu_session.sh cpu-control 1/2  # the CPU zoo as "cpu", with each session's threads pinned to the same cores
#                                              # and the original timed twice (its "control" ratio: this measurement's own spread)
#   bash benchmarks/gpu_session.sh cpu-profile [M,N] [RULE,..]  # CPU provider, 4 threads: sessions of one model against each
#                                              # other (ort_session_spread.py), then per-op profiles of the original, graphopt,
#                                              # the anchors, the original again and graphopt without each RULE, threads pinned;
#                                              # whether onnxruntime runs the original's graph (ort_cpu_profile.py)
#   bash benchmarks/gpu_session.sh placement M,N # the nodes the CUDA provider hands to the CPU, original and graphopt fp32/fp16 (ort_placement.py)
#   bash benchmarks/gpu_session.sh llm-profile [VARIANT]  # the GPU kernels of a decode step (graphopt-ro, and VARIANT), per step
#   bash benchmarks/gpu_session.sh autotune-choices  # graphopt's GEMM + activation kernel against inductor's code per site in
#                                              # max-autotune: the winner, both times, the block vs inductor alone, same code? (< 4 min);
#                                              # "autotune-choices wq": int4 weights, graphopt::wq_linear's sites
#   bash benchmarks/gpu_session.sh llm         # LLM prefill + greedy decode with a static KV cache (llm_decode.py), under 4 minutes
#   bash benchmarks/gpu_session.sh bias-act [M,N] # issue 14: a GEMM's bias in BiasGelu or in the Gemm (ort_bias_act.py), CUDA and 4 CPU
#                                              # threads, merged into the cost table, then the models it changes on the CPU provider
#   bash benchmarks/gpu_session.sh decode-all [VARIANTS]  # issues 17/18: decode at batch 1, the anchor, graphopt fp16 (with and without
#                                              # its decode GEMV), int4, int8 (llm_decode.py, < 9.5 min)
#   bash benchmarks/gpu_session.sh norms cuda  # residual norms fused or not (ort_cpu_norms.py) on the CUDA provider; "norms cpu": 4 CPU threads
#   bash benchmarks/gpu_session.sh wq kernels  # weight-only int8/int4 (issue 18): graphopt::wq_linear's Triton kernel compiled, against its reference
#   bash benchmarks/gpu_session.sh wq bench    # the kernels at TinyLlama's decode shapes (qkv, gate/up packed; down; o), M = 1, 8, 16: fp16 cuBLAS,
#                                              # graphopt int4/int8 (the decode GEMV, its configs swept at M = 1) against the old tiled kernel
#                                              # (autotuned), _weight_int4pack_mm; CUDA-graph replays over 160 MB of weights; GB/s (< 3 min)
#   bash benchmarks/gpu_session.sh wq ro       # TinyLlama decode at batch 1: fp16 / int4 / int8 (graphopt + inductor CUDA graphs), torchao int4 if importable;
#                                              # prints int4/fp16 and int8/fp16 (< 5 min: weights quantized on the GPU, no variant started after 200 s)
#   bash benchmarks/gpu_session.sh wq cg       # the same without inductor (graphopt's graph replayed as one CUDA graph)
#   bash benchmarks/gpu_session.sh gemv        # issue 17: graphopt::gemv_linear's Triton GEMV against cuBLAS (F.linear) at TinyLlama's
#                                              # decode shapes, M = 1, 4, 8, 16 fp16 and M = 1 bf16: every autotune config and the pick,
#                                              # CUDA graphs over rotating weights and do_bench, GB/s (gemv_bench.py; < 4 min)
#   bash benchmarks/gpu_session.sh gemv kernels  # the kernel compiled against torch, every config (tests/gemv_interpreter_cases.py)
#   bash benchmarks/gpu_session.sh gemv ro     # TinyLlama decode at batch 1: eager (tokens), graphopt-ro, graphopt-gemv-ro (options gemv=True:
#                                              # the decode GEMMs offered to inductor's autotuner as graphopt::gemv_linear) (< 5 min)
#   bash benchmarks/gpu_session.sh fp8         # FP8 GEMMs (issue 18): TinyLlama-shaped bf16 vs precision="fp8", decode (batch 1) and a
#                                              # 2048-token prefill, and _scaled_mm vs bf16 mm per GEMM shape at M=1,16,2048 (fp8_bench.py)
#   bash benchmarks/gpu_session.sh accuracy    # issue 18 item 4: TinyLlama-shaped, random weights, fp16 reference: bf16 / int8 / int4 /
#                                              # fp8 over 128 greedy steps, teacher-forced and free-running: logits cosine, top-1
#                                              # agreement, first divergence, per-layer SNR (quant_accuracy.py; < 8 min)
#   bash benchmarks/gpu_session.sh llm-family F torch|onnx  # issue 17, one decoder family F (llama3, qwen2, mistral, phi3, gemma;
#                                              # tests/llm_families.py) at full size, fp16, batch 1: "torch" its static-cache decode,
#                                              # inductor's CUDA graphs against graphopt's (llm_decode.py --family); "onnx" decode steps
#                                              # of a 4-layer export, the export against graphopt's (llm_onnx_decode.py --family)
#   bash benchmarks/gpu_session.sh decode-window  # issue 17, sliding window on the torch path (< 5 min): graphopt::decode_attention
#                                              # over a static cache with and without its key range (decode_window_bench.py: a 4096
#                                              # window over 32k rows, 256 over 4k, the causal bound alone; Mistral-7B's heads, fp16,
#                                              # batch 1 and 8), then the full-size Mistral with a window of 64 over a cache of every
#                                              # position, eager / inductor-ro / graphopt-cg (llm_decode.py --family mistral --window 64)
#   bash benchmarks/gpu_session.sh llm-onnx    # decode steps of a 4-layer TinyLlama-shaped export with a KV cache, fp16, CUDA, io-binding:
#                                              # the export against graphopt's GroupQueryAttention (llm_onnx_decode.py)
#   bash benchmarks/gpu_session.sh genai-build # issue 17: the 1.1B-shaped LlamaConfig's folder, the onnxruntime-genai builder's fp16 CUDA
#                                              # model (its wheel from .whl/, installed by setup), the fp16 export and graphopt's
#                                              # --kv-buffer shared output, into /tmp/genai (kept on the warm machine)
#   bash benchmarks/gpu_session.sh genai       # then (same warm machine): both decoded in onnxruntime-gpu with io-binding and shared
#                                              # KV buffers, the export and the builder's growing cache too (llm_genai_compare.py)
#   bash benchmarks/gpu_session.sh genai-cg    # issue 17, CUDA graphs (< 9 min): builds as genai-build (reusing /tmp/genai; graphopt's
#                                              # output made again), then the builder's and graphopt's models with every buffer bound
#                                              # once (-static) and the same replayed as the CUDA provider's CUDA graph (-cg), the
#                                              # io-binding variants of "genai" (-shared) for reference: ms/token, tok/s, tokens
#                                              # equal with and without the graph (llm_genai_compare.py, ort_static_decode.py)
#   bash benchmarks/gpu_session.sh genai-build int4  # issue 18's ORT anchor: the same folder's builder int4 CUDA model (-p int4 -e cuda),
#                                              # the fp16 export (reused from genai-build) and graphopt's --weights int4 outputs
#                                              # (llm_genai_int4.py --build-only; resumes where a timed-out run stopped: run it again)
#   bash benchmarks/gpu_session.sh genai int4  # then: the export, graphopt fp16, the builder's int4 and graphopt's int4 variants
#                                              # decoded with io-binding, shared KV buffers; accuracy against the fp16 export
#   bash benchmarks/gpu_session.sh llm-onnx-weights [LAYERS] [BLOCK]  # the same export, fp16: graphopt against graphopt
#                                              # --weights int4 / int8 (com.microsoft.MatMulNBits, block 32 by default)
#   bash benchmarks/gpu_session.sh qdq cuda    # quantized models (qdq_zoo.py, built there with torch and transformers, or carried:
#                                              # benchmarks/.qdq_zoo without its float folders, ~50 MB): original, ORT offline,
#                                              # graphopt --target ort-cuda (qdq_bench.py); "qdq cpu": the CPU provider, 4 threads
#
# Every step prints the GPU's name and writes its full results under $OUT; the short tables come last.
set -uo pipefail
step=${1:?step}
export PYTHONUNBUFFERED=1
# genai-build int4 / genai int4: the builder's int4 model and graphopt's, LM head kept (default) and quantized, zero points or not
GENAI_INT4=export,graphopt,builder-int4,graphopt-int4,graphopt-int4-head,graphopt-int4-head-sym
export PYTHONPATH=$PWD:/tmp/ort:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# The cost table measured by the decisions step (kept on the machine: each run gets a fresh checkout).
for measured in /tmp/measured_cost_table.json /tmp/measured_precision_table.json /tmp/measured_recurrent_table.json; do
  if [ -f "$measured" ]; then
    python3 benchmarks/decisions_bench.py --merge "$measured" --into graphopt/decisions/cost_table.json >/dev/null
  fi
done

case "$step" in
setup)
  if [ -d /tmp/ort ] && ls /tmp/ort/part.* >/dev/null 2>&1 && [ ! -d /tmp/ort/onnxruntime ]; then
    cat /tmp/ort/part.* | xz -d | tar x -C /tmp/ort
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  python3 -c "import onnxruntime as o; o.preload_dlls(); print(o.__version__, o.get_available_providers())"
  ;;
decisions)
  timeout 200 python3 benchmarks/decisions_bench.py --out "$OUT" --budget-s 150 > "$OUT/decisions.log" 2>&1
  tail -25 "$OUT/decisions.log"
  if [ -f "$OUT/cost_table.json" ]; then
    cp "$OUT/cost_table.json" /tmp/measured_cost_table.json
    python3 benchmarks/decisions_bench.py --merge "$OUT/cost_table.json" --into graphopt/decisions/cost_table.json
  fi
  timeout 330 python3 benchmarks/zoo_bench.py --device cuda --jobs 12 --runs 10 --rounds 8 --warmup 5 --shard "${2:-1/2}" \
    --out "$OUT/zoo_bench-1.json" > "$OUT/zoo-1.log" 2>&1
  tail -40 "$OUT/zoo-1.log"
  ;;
precision)
  # f32 blocks only: fp32 vs fp16 (NCHW and NHWC, Casts included); batch 1 first, the budget may cut some batch-32 classes.
  timeout 175 python3 benchmarks/decisions_bench.py --decisions precision --dtypes f32 --kinds dense1,dense3,dense7,depthwise3,depthwise5,grouped3 \
    --budget-s 140 --out "$OUT" > "$OUT/precision.log" 2>&1
  tail -45 "$OUT/precision.log"
  if [ -f "$OUT/cost_table.json" ]; then
    cp "$OUT/cost_table.json" /tmp/measured_precision_table.json
    python3 benchmarks/decisions_bench.py --merge "$OUT/cost_table.json" --into graphopt/decisions/cost_table.json
  fi
  ;;
precision-rnn)
  # one LSTM/GRU per block, forward and bidirectional, hidden 64-512, sequences 25 and 100, batch 1 first then 32:
  # fp32 vs fp16 (Casts included); 64 configurations, the budget may cut some batch-32 ones.
  timeout 230 python3 benchmarks/decisions_bench.py --decisions recurrent_precision --rnn-ops lstm,gru --directions forward,bidirectional \
    --hidden 64,128,256,512 --sequences 25,100 --batches 1,32 --runs 50 --budget-s 180 --out "$OUT/rnn" > "$OUT/precision-rnn.log" 2>&1
  tail -70 "$OUT/precision-rnn.log"
  if [ -f "$OUT/rnn/cost_table.json" ]; then
    cp "$OUT/rnn/cost_table.json" /tmp/measured_recurrent_table.json
    python3 benchmarks/decisions_bench.py --merge "$OUT/rnn/cost_table.json" --into graphopt/decisions/cost_table.json
  fi
  ;;
zoo)
  shard=${2:-2/2}
  timeout 450 python3 benchmarks/zoo_bench.py --device cuda --jobs 12 --runs 10 --rounds 8 --warmup 5 --shard "$shard" \
    --out "$OUT/zoo_bench-${shard%/*}.json" > "$OUT/zoo-${shard%/*}.log" 2>&1
  tail -60 "$OUT/zoo-${shard%/*}.log"
  ;;
zoo-recheck)
  # the models a zoo run flagged, again: launching thread pinned, the original timed twice (control), files that
  # onnxruntime runs as one graph timed once; "zoo-recheck cpu M,N" on the CPU provider (4 threads pinned)
  if [ "${2:-}" = cpu ]; then
    lscpu | grep -m1 "Model name"
    timeout 560 python3 benchmarks/zoo_bench.py --device cpu --threads 4 --jobs 12 --runs 10 --rounds 8 --warmup 3 --control --pin \
      --models "${3:?models}" --out "$OUT/zoo_bench-recheck-cpu.json" > "$OUT/zoo-recheck-cpu.log" 2>&1
    tail -40 "$OUT/zoo-recheck-cpu.log"
  else
    timeout 560 python3 benchmarks/zoo_bench.py --device cuda --jobs 12 --runs 10 --rounds 8 --warmup 5 --control --pin \
      --models "${2:?models}" --out "$OUT/zoo_bench-recheck-cuda.json" > "$OUT/zoo-recheck-cuda.log" 2>&1
    tail -40 "$OUT/zoo-recheck-cuda.log"
  fi
  ;;
placement)
  timeout 500 python3 benchmarks/ort_placement.py --models "${2:-hb-fpn-upsample-op11,hb-yolo-mish-op18}" --precisions fp32,fp16 \
    --out "$OUT/placement" > "$OUT/placement.log" 2>&1
  tail -80 "$OUT/placement.log"
  ;;
profile)
  timeout 500 python3 benchmarks/ort_profile.py --models "${2:?models}" --out "$OUT" > "$OUT/profile.log" 2>&1
  tail -120 "$OUT/profile.log"
  ;;
norm14)
  timeout 120 python3 benchmarks/ort_profile.py --models tf-transformer,jax-vit --runs 200 --out "$OUT/norm14" \
    --variants original,original-fp16,graphopt-fp16,graphopt-fp16+keep=Softmax,graphopt-fp16+off=FuseLayerNormMoments:FuseLayerNormSecondMoment \
    > "$OUT/norm14-profile.log" 2>&1
  timeout 110 python3 benchmarks/zoo_bench.py --device cuda --models tf-transformer,jax-vit --jobs 4 --runs 10 --rounds 8 --warmup 5 \
    --out "$OUT/zoo_bench-norm14.json" > "$OUT/norm14-zoo.log" 2>&1
  tail -60 "$OUT/norm14-profile.log"; tail -12 "$OUT/norm14-zoo.log"
  ;;
cpu)
  shard=${2:-1/1}
  lscpu | grep -m1 "Model name"
  timeout 560 python3 benchmarks/zoo_bench.py --device cpu --threads 4 --jobs 12 --runs 10 --rounds 8 --warmup 3 --shard "$shard" \
    --out "$OUT/zoo_bench-cpu-${shard%/*}.json" > "$OUT/zoo-cpu-${shard%/*}.log" 2>&1
  tail -60 "$OUT/zoo-cpu-${shard%/*}.log"
  ;;
cpu-control)
  shard=${2:-1/1}
  lscpu | grep -m1 "Model name"
  timeout 560 python3 benchmarks/zoo_bench.py --device cpu --threads 4 --jobs 12 --runs 10 --rounds 8 --warmup 3 --shard "$shard" \
    --control --pin --out "$OUT/zoo_bench-cpu-control-${shard%/*}.json" > "$OUT/zoo-cpu-control-${shard%/*}.log" 2>&1
  tail -60 "$OUT/zoo-cpu-control-${shard%/*}.log"
  ;;
cpu-profile)
  # Sessions of one model in one process (how far apart they run: the measurement's own spread), then per-op
  # profiles with every session's threads pinned (ort_cpu_profile.py): graphopt against the original, the anchors,
  # the original again and graphopt without each RULE (FuseAttention: MultiHeadAttention; FuseSkipLayerNorm: the
  # residual norms left to onnxruntime, as onnxscript's output has them).
  lscpu | grep -m1 "Model name"
  timeout 180 python3 benchmarks/ort_session_spread.py --models resnet-dynamo,tf-resnet,paddle-resnet --threads 4 \
    --out "$OUT/spread" > "$OUT/cpu-spread.log" 2>&1
  timeout 370 python3 benchmarks/ort_cpu_profile.py --models "${2:-unet-block-dynamo,tf-resnet,paddle-resnet}" \
    --variants original,graphopt,ort-offline-all,onnxscript,original-again --rules-off "${3:-FuseAttention,FuseSkipLayerNorm}" \
    --threads 4 --runs 20 --rounds 20 --pin --out "$OUT/cpu-profile" > "$OUT/cpu-profile.log" 2>&1
  cat "$OUT/cpu-spread.log" "$OUT/cpu-profile.log" | grep -v -i "warn\|serializ\|skipping constant\|cannot be found" | tail -200
  ;;
norms)
  # the skip_norm decision's figures (ort_cpu_norms.py): "cuda" on the GPU (io-binding), "cpu" on this host's CPU provider
  if [ "${2:-cuda}" = cuda ]; then
    timeout 560 python3 benchmarks/ort_cpu_norms.py --provider cuda --threads 1 --rounds 15 --out "$OUT/ort_cpu_norms-cuda.json" > "$OUT/norms-cuda.log" 2>&1
    tail -160 "$OUT/norms-cuda.log"
  else
    lscpu | grep -m1 "Model name"
    timeout 560 python3 benchmarks/ort_cpu_norms.py --threads 4 --rounds 15 --out "$OUT/ort_cpu_norms-cpu-4threads.json" > "$OUT/norms-cpu.log" 2>&1
    tail -160 "$OUT/norms-cpu.log"
  fi
  ;;
bias-act)
  # issue 14: the bias_act decision's figures (ort_bias_act.py): the CUDA provider (f32, f16) and this host's CPU (4 threads,
  # pinned), merged with the 2-core machine's into the cost table here; then ${2:-the models it changes} on the CPU provider
  # against their original and the anchors (zoo_bench, control, pinned). Under 9 minutes.
  lscpu | grep -m1 "Model name"
  if python3 -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())"; then
    timeout 150 python3 benchmarks/ort_bias_act.py --provider cuda --threads 1 --dtypes f32 f16 --rounds 10 \
      --out "$OUT/ort_bias_act-cuda.json" > "$OUT/bias-act-cuda.log" 2>&1
    tail -3 "$OUT/bias-act-cuda.log"
  fi
  timeout 200 taskset -c 0-3 python3 benchmarks/ort_bias_act.py --threads 4 --rounds 10 --out "$OUT/ort_bias_act-cpu-4threads.json" \
    > "$OUT/bias-act-cpu.log" 2>&1
  tail -3 "$OUT/bias-act-cpu.log"
  python3 benchmarks/ort_bias_act.py --entries-from benchmarks/results/ort_bias_act-2026-11-28-cpu2core.json "$OUT/ort_bias_act-cpu-4threads.json" \
    $(ls "$OUT"/ort_bias_act-cuda.json 2>/dev/null) --into graphopt/decisions/cost_table.json
  cp graphopt/decisions/cost_table.json "$OUT/cost_table-merged.json"
  models=${2:-bart-torchscript,beit-torchscript,bert-dynamo,bert-torchscript,convnext-dynamo,deberta-v2-torchscript,deit-torchscript,dinov2-dynamo,distilbert-dynamo,electra-dynamo,roberta-torchscript,swin-torchscript,vit-dynamo,wav2vec2-torchscript,whisper-decoder-dynamo,whisper-encoder-dynamo}
  timeout 300 python3 benchmarks/zoo_bench.py --device cpu --threads 4 --jobs 12 --runs 10 --rounds 8 --warmup 3 --control --pin \
    --models "$models" --out "$OUT/zoo_bench-bias-act-cpu.json" > "$OUT/zoo-bias-act-cpu.log" 2>&1
  tail -45 "$OUT/zoo-bias-act-cpu.log"
  ;;
torch)
  timeout 300 python3 benchmarks/torch_compile.py --models "${2:-llama,convnext}" --variants inductor,graphopt+inductor \
    --out "$OUT/torch_compile.json" > "$OUT/torch.log" 2>&1
  tail -20 "$OUT/torch.log"
  ;;
llm-profile)
  # where a decode step's time goes (issues 17/18): graphopt-ro (and ${2:-}, e.g. graphopt-int4-ro), batch 1, the GPU kernels
  # of one profiled generation's decode steps per step, against the step's wall time (< 4 minutes)
  timeout 230 python3 benchmarks/llm_decode.py --variants "graphopt-ro${2:+,$2}" --batches 1 --new-tokens 32 --runs 2 --profile 30 \
    --budget-s 180 --out "$OUT/llm_decode-profile.json" > "$OUT/llm_decode-profile.log" 2>&1
  tail -80 "$OUT/llm_decode-profile.log"
  ;;
llm)
  # LLM decode (issue 17): TinyLlama-shaped, fp16, batches 1 and 8; no (batch, variant) starts after 150 s.
  timeout 230 python3 benchmarks/llm_decode.py --out "$OUT/llm_decode.json" > "$OUT/llm_decode.log" 2>&1
  tail -16 "$OUT/llm_decode.log"
  ;;
wq)
  case "${2:-ro}" in
  kernels)
    GRAPHOPT_KERNELS_DEVICE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/wq_interpreter_cases.py \
      > "$OUT/wq_kernels.log" 2>&1
    tail -15 "$OUT/wq_kernels.log"
    ;;
  bench)
    timeout 200 python3 benchmarks/wq_kernel_bench.py --budget-s 140 --configs m1 --block-size "${3:-32}" --out "$OUT/wq_kernel_bench.json" \
      > "$OUT/wq_kernel_bench.log" 2>&1
    tail -40 "$OUT/wq_kernel_bench.log"
    ;;
  ro|cg)
    # < 5 min: int4 before int8 (the issue's main goal); no variant starts after 200 s (the JSON is written after each)
    if [ "${2:-ro}" = ro ]; then variants=eager,graphopt-ro,graphopt-int4-ro,graphopt-int8-ro,torchao-int4-ro
    else variants=eager,graphopt-cg,graphopt-int4-cg,graphopt-int8-cg; fi
    timeout 295 python3 benchmarks/llm_decode.py --variants "$variants" --batches 1 --new-tokens 64 --block-size "${3:-32}" \
      --budget-s 200 --out "$OUT/llm_decode-wq-${2:-ro}.json" > "$OUT/llm_decode-wq-${2:-ro}.log" 2>&1
    tail -15 "$OUT/llm_decode-wq-${2:-ro}.log"
    ;;
  *) echo "wq takes kernels, bench, ro or cg" >&2; exit 2 ;;
  esac
  ;;
decode-all)
  # issues 17 and 18 in one call (< 9.5 min): TinyLlama-1.1B shape, batch 1, 64 greedy tokens: the compiled static-cache
  # anchor (inductor reduce-overhead), graphopt-ro, graphopt with its decode GEMV offered to inductor, int4 and int8
  timeout 570 python3 benchmarks/llm_decode.py --variants "${2:-eager,inductor-ro,graphopt-ro,graphopt-gemv-ro,graphopt-int4-ro,graphopt-int8-ro}" \
    --batches 1 --new-tokens 64 --block-size 32 --budget-s 430 --out "$OUT/llm_decode-all.json" > "$OUT/llm_decode-all.log" 2>&1
  echo "exit $?"
  tail -22 "$OUT/llm_decode-all.log"
  ;;
gemv)
  if [ "${2:-}" = kernels ]; then
    GRAPHOPT_KERNELS_DEVICE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gemv_interpreter_cases.py \
      > "$OUT/gemv_kernels.log" 2>&1
    tail -15 "$OUT/gemv_kernels.log"
    exit 0
  fi
  if [ "${2:-}" = ro ]; then
    timeout 295 python3 benchmarks/llm_decode.py --variants eager,graphopt-ro,graphopt-gemv-ro --batches 1 --new-tokens 64 \
      --budget-s 150 --out "$OUT/llm_decode-gemv-ro.json" > "$OUT/llm_decode-gemv-ro.log" 2>&1
    echo "exit $?"
    grep "gemv_kernels\|^batch" "$OUT/llm_decode-gemv-ro.log" | tail -4
    tail -8 "$OUT/llm_decode-gemv-ro.log"
    exit 0
  fi
  timeout 230 python3 benchmarks/gemv_bench.py --budget-s 150 --out "$OUT/gemv_bench.json" > "$OUT/gemv_bench.log" 2>&1
  echo "exit $?"
  head -2 "$OUT/gemv_bench.log"
  sed -n '/^shape /,$p' "$OUT/gemv_bench.log" | tail -40
  ;;
decode-window)
  timeout 120 python3 benchmarks/decode_window_bench.py --out "$OUT/decode_window_bench.json" > "$OUT/decode_window_bench.log" 2>&1
  tail -9 "$OUT/decode_window_bench.log"
  timeout 420 python3 benchmarks/llm_decode.py --family mistral --window 64 --variants eager,inductor-ro,graphopt-cg \
    --batches 1 --new-tokens 128 --budget-s 300 --out "$OUT/llm_decode-mistral-window64.json" > "$OUT/llm_decode-mistral-window64.log" 2>&1
  tail -8 "$OUT/llm_decode-mistral-window64.log"
  ;;
llm-family)
  family="${2:?llm-family takes a family: llama3, qwen2, mistral, phi3 or gemma}"
  case "${3:-torch}" in
  torch)
    timeout 560 python3 benchmarks/llm_decode.py --family "$family" --variants eager,inductor-ro,graphopt-ro,graphopt-cg --batches 1 \
      --new-tokens 64 --budget-s 420 --out "$OUT/llm_decode-$family.json" > "$OUT/llm_decode-$family.log" 2>&1
    tail -12 "$OUT/llm_decode-$family.log"
    ;;
  onnx)
    # the models (Gemma's embedding alone is 1 GB in fp16) stay on the machine; the figures come back
    timeout 540 python3 benchmarks/llm_onnx_decode.py --out "/tmp/llm-onnx-$family" --family "$family" --device cuda --dtype fp16 \
      --layers 4 --batch 1 --prompt 128 --steps 64 > "$OUT/llm_onnx_decode-$family.log" 2>&1
    cp "/tmp/llm-onnx-$family/llm_onnx_decode.json" "$OUT/llm_onnx_decode-$family.json" 2>/dev/null
    tail -12 "$OUT/llm_onnx_decode-$family.log"
    ;;
  *) echo "llm-family takes torch or onnx after the family" >&2; exit 2 ;;
  esac
  ;;
llm-onnx)
  timeout 540 python3 benchmarks/llm_onnx_decode.py --out "$OUT" --device cuda --dtype fp16 --layers "${2:-4}" \
    --batch 1,8 --prompt 128 --steps 64 > "$OUT/llm_onnx_decode.log" 2>&1
  tail -20 "$OUT/llm_onnx_decode.log"
  ;;
genai-build)
  if [ "${2:-}" = int4 ]; then
    timeout 580 python3 benchmarks/llm_genai_int4.py --out "$OUT" --work /tmp/genai --device cuda --shape tinyllama \
      --genai-python python3 --variants "$GENAI_INT4" --build-only --reuse > "$OUT/genai-build-int4.log" 2>&1
    grep -v -i warn "$OUT/genai-build-int4.log" | grep -v "^Saving\|^Writing\|^Loading" | tail -16
    exit 0
  fi
  timeout 580 python3 benchmarks/llm_genai_compare.py --out "$OUT" --work /tmp/genai --device cuda --dtype fp16 --shape tinyllama \
    --genai-python python3 --build-only > "$OUT/genai-build.log" 2>&1
  grep -v -i warn "$OUT/genai-build.log" | tail -12
  ;;
genai)
  if [ "${2:-}" = int4 ]; then
    timeout 560 python3 benchmarks/llm_genai_int4.py --out "$OUT" --work /tmp/genai --device cuda --shape tinyllama \
      --genai-python python3 --variants "${3:-$GENAI_INT4}" --prompt 128 --steps 128 --rounds 3 --warmup 8 --reuse \
      > "$OUT/genai-int4.log" 2>&1
    tail -10 "$OUT/genai-int4.log"
    exit 0
  fi
  timeout 560 python3 benchmarks/llm_genai_compare.py --out "$OUT" --work /tmp/genai --device cuda --dtype fp16 --shape tinyllama \
    --genai-python python3 --prompt 128 --steps 128 --rounds 3 --warmup 8 --reuse \
    --variants "${2:-builder-shared,graphopt-shared,original,builder-growing}" > "$OUT/genai.log" 2>&1
  tail -12 "$OUT/genai.log"
  ;;
genai-cg)
  # the folder, the builder's model and the export are kept from genai-build when this machine ran it; graphopt's
  # output is made again (no --reuse: its kv_buffer pass writes the static-shape form the -cg variants need)
  timeout 370 python3 benchmarks/llm_genai_compare.py --out "$OUT/cg-build" --work /tmp/genai --device cuda --dtype fp16 --shape tinyllama \
    --genai-python python3 --build-only > "$OUT/genai-cg-build.log" 2>&1
  grep -v -i warn "$OUT/genai-cg-build.log" | grep "builder:\|export:\|graphopt\|rror" | cut -c1-400 | tail -6
  timeout 170 python3 benchmarks/llm_genai_compare.py --out "$OUT" --work /tmp/genai --device cuda --dtype fp16 --shape tinyllama \
    --genai-python python3 --prompt 128 --steps 128 --rounds 3 --warmup 8 --reuse \
    --variants "${2:-builder-shared,graphopt-shared,builder-static,graphopt-static,builder-cg,graphopt-cg}" > "$OUT/genai-cg.log" 2>&1
  grep -i "error\|refus\|memcpy" "$OUT/genai-cg.log" | grep -v -i "warn" | cut -c1-1500 | head -6
  tail -10 "$OUT/genai-cg.log"
  ;;
llm-onnx-weights)
  # issue 18: weight-only int4/int8 against fp16, same GPU, same run; the original again last (process state)
  timeout 560 python3 benchmarks/llm_onnx_decode.py --out "$OUT/weights" --device cuda --dtype fp16 --layers "${2:-4}" \
    --batch 1,8 --prompt 128 --steps 64 --block-size "${3:-32}" \
    --variants original,graphopt,graphopt-int4,graphopt-int8,original > "$OUT/llm_onnx_weights.log" 2>&1
  tail -20 "$OUT/llm_onnx_weights.log"
  ;;
accuracy)
  timeout 560 python3 benchmarks/quant_accuracy.py --tinyllama --device cuda --variants "${2:-int8,int4,fp8,bf16}" \
    --out "$OUT/quant_accuracy-tinyllama.json" > "$OUT/quant_accuracy.log" 2>&1
  tail -12 "$OUT/quant_accuracy.log"
  ;;
fp8)
  timeout 560 python3 benchmarks/fp8_bench.py --budget-s 420 --out "$OUT/fp8_bench.json" > "$OUT/fp8_bench.log" 2>&1
  tail -40 "$OUT/fp8_bench.log"
  ;;
torch-modes)
  timeout 560 python3 benchmarks/torch_compile.py --models "${2:-llama}" \
    --variants inductor,graphopt+inductor,inductor-ro,graphopt+inductor-ro,inductor-ma,graphopt+inductor-ma \
    --out "$OUT/torch_compile-modes-${2:-llama}.json" > "$OUT/torch-modes.log" 2>&1
  tail -20 "$OUT/torch-modes.log"
  ;;
train)
  # training steps (fwd+bwd+AdamW, autocast bf16) through the backend against inductor (torch_train.py)
  timeout 560 python3 benchmarks/torch_train.py --models "${2:-bert,vit,resnet50}" --out "$OUT/torch_train.json" > "$OUT/torch-train.log" 2>&1
  tail -12 "$OUT/torch-train.log"
  ;;
train-dist)
  # the same under DDP and FSDP2 on every GPU of the machine (torchrun), BERT-base
  n=$(nvidia-smi -L | wc -l)
  for wrap in ${3:-ddp fsdp2}; do
    timeout 270 torchrun --standalone --nproc_per_node "$n" benchmarks/torch_train.py --models "${2:-bert}" --wrap $wrap \
      --out "$OUT/torch_train-$wrap.json" > "$OUT/torch-train-$wrap.log" 2>&1
    tail -8 "$OUT/torch-train-$wrap.log"
  done
  ;;
torch-kernels)
  # Default and reduce-overhead against inductor's, with each variant's GPU kernels (count, time, the top ones):
  # whether every attention runs a fused SDPA kernel (fmha/flash/cudnn) or SDPA's math form (bmm + softmax).
  timeout 560 python3 benchmarks/torch_compile.py --models "${2:-t5}" --kernels \
    --variants inductor,graphopt+inductor,inductor-ro,graphopt+inductor-ro \
    --out "$OUT/torch_compile-kernels-${2:-t5}.json" > "$OUT/torch-kernels.log" 2>&1
  tail -12 "$OUT/torch-kernels.log"
  python3 - "$OUT/torch_compile-kernels-${2:-t5}.json" <<'PY'
import json, re, sys
for result in json.load(open(sys.argv[1]))["results"]:
    for variant, entry in result["variants"].items():
        k = entry.get("kernels") or {}
        attention = sorted({re.match(r"[\w:]*", re.sub(r"^void\s+", "", t["name"])).group(0)[:48] for t in k.get("top", [])
                            if re.search(r"fmha|flash|attention|cudnn|bmm|softmax", t["name"], re.I)})
        print(f"{result['model']:6s} {variant:22s} kernels/run {k.get('kernels_per_run', '-')!s:>7s}  "
              f"GPU ms/run {k.get('gpu_ms_per_run', '-')!s:>8s}  attention kernels: {', '.join(attention) or '-'}")
PY
  ;;
t5-attention)
  timeout 235 python3 benchmarks/t5_attention_check.py --budget-s 215 --out "$OUT/t5_attention" > "$OUT/t5-attention.log" 2>&1
  echo "exit $?"
  grep -v -i "warn" "$OUT/t5-attention.log" | tail -40
  ;;
torch-zoo)
  shard=${2:-1/6}; modes=${3:-default,reduce-overhead}; dtypes=${4:-fp16}
  budget=400; case "$modes" in *max-autotune*) budget=330 ;; esac
  tag="${shard/\//of}-${modes//,/+}-${dtypes//,/+}"
  timeout 560 python3 benchmarks/torch_zoo.py --device cuda --shard "$shard" --modes "$modes" --dtypes "$dtypes" \
    ${5:+--models "$5"} --budget-s "$budget" --out "$OUT/torch_zoo-$tag.json" > "$OUT/torch-zoo-$tag.log" 2>&1
  echo "exit $?"
  if grep -q "^device: " "$OUT/torch-zoo-$tag.log"; then
    grep -v -i "warn" "$OUT/torch-zoo-$tag.log" | sed -n '/^\(not started\|device: \)/,$p'
  else  # cut by the timeout: the JSON holds every model finished; the log's end says where it stopped
    grep -v -i "warn" "$OUT/torch-zoo-$tag.log" | tail -25
  fi
  ;;
autotune-choices)
  # issue 15 item 1: graphopt::linear_act timed against inductor's compiled code per GEMM + ReLU / tanh-GELU site, in
  # max-autotune (graphopt/inductor_sites.py): which side won per site and by how much, the block under inductor alone
  # and graphopt with sites, and whether graphopt's code is inductor's byte for byte (< 4 min)
  # "autotune-choices wq": int4 weights at 16 tokens, graphopt::wq_linear against inductor's dequantize + GEMM
  if [ "${2:-}" = wq ]; then extra="--weights int4 --tokens 16"; else extra=""; fi
  timeout 235 python3 benchmarks/autotune_choices.py $extra --out "$OUT/autotune_choices${2:+-$2}.json" > "$OUT/autotune-choices.log" 2>&1
  echo "exit $?"
  grep -v -i "warn" "$OUT/autotune-choices.log" | tail -20
  ;;
torch-cost)
  timeout 560 python3 benchmarks/torch_compile_cost.py --models "${2:-llama,t5,convnext}" \
    --out "$OUT/torch_compile_cost.json" > "$OUT/torch-cost.log" 2>&1
  grep -A12 "^model " "$OUT/torch-cost.log"
  ;;
qdq)
  device=${2:-cuda}
  threads=0; [ "$device" = cpu ] && threads=4
  # QDQ_MODELS: a comma-separated subset of qdq_zoo's models (14 in all: one 10-minute call does not hold them all;
  # e.g. QDQ_MODELS=resnet18-mo-int8,resnet18-mo-fp8,bert-mo-int8,bert-mo-fp8,bert-mo-int4,bert-mo-int4-awq,bert-mo-int4-t,bert-dyn,bert-int4-qdq)
  timeout 200 python3 benchmarks/qdq_zoo.py --list ${QDQ_MODELS:+--models "$QDQ_MODELS"} > "$OUT/qdq_zoo.log" 2>&1 || { tail -20 "$OUT/qdq_zoo.log"; exit 1; }
  timeout 360 python3 benchmarks/qdq_bench.py --device "$device" --threads "$threads" --runs 20 --rounds 8 --warmup 5 \
    ${QDQ_MODELS:+--models "$QDQ_MODELS"} --out "$OUT/qdq_bench-$device.json" > "$OUT/qdq-$device.log" 2>&1
  tail -16 "$OUT/qdq-$device.log"
  ;;
*)
  echo "unknown step $step" >&2; exit 2
  ;;
esac
