# infir on NVIDIA's NGC PyTorch image: CUDA, cuDNN, NCCL, Transformer Engine and apex come built and
# tested together there; we add megatron-core (pinned, as pyproject.toml allows) and infir itself.
#
# Build, from the repository root:
#   docker build -t infir .
#   docker build --build-arg NGC_TAG=25.12 -t infir .        # another NGC release
#
# Run (GPUs, host IPC for shared-memory tensors between ranks, outputs kept on the host):
#   docker run --rm --gpus all --ipc=host -v "$PWD/outputs:/workspace/infir/outputs" infir bash launch/pipeline.sh
#   docker run --rm --gpus all --ipc=host -v "$PWD/outputs:/workspace/infir/outputs" infir bash launch/torchrun.sh model=qwen2.5-1.5b parallel=tp2 run_dir=outputs/tp2
#   docker run --rm --gpus all --ipc=host -v "$PWD/outputs:/workspace/infir/outputs" infir infir-compare outputs/pipeline --out outputs/pipeline/report
#
# Test suite (the CPU tests; with --gpus all the `gpu`-marked tests run too):
#   docker run --rm infir python -m pytest tests -q
#   docker run --rm --gpus all infir python -m pytest tests -q -m gpu
#
# On a SLURM cluster with pyxis/enroot: INFIR_IMAGE=<registry>/infir sbatch launch/slurm.sbatch ... (see that file).

# NGC 25.11 (Ubuntu 24.04, Python 3.12, CUDA 13, Transformer Engine 2.x): of the time of megatron-core 0.16,
# whose releases are tested on the previous month's NGC image. Check the tag's release notes before changing it.
ARG NGC_TAG=25.11
FROM nvcr.io/nvidia/pytorch:${NGC_TAG}-py3

WORKDIR /workspace/infir

# megatron-core first, in its own layer: editing infir does not reinstall it. NGC's pip constraint file
# (/etc/pip/constraint.txt, via PIP_CONSTRAINT) stays on, so no pip install here can replace the
# image's own torch, Transformer Engine or apex builds.
RUN pip install --no-cache-dir "megatron-core==0.16.1"

COPY . .
# Editable: infir-train and infir-eval read conf/ and eval/ from this checkout.
RUN pip install --no-cache-dir -e ".[dev]"

# W&B logs offline by default (runs land in each run_dir/wandb/); pass -e WANDB_MODE=online -e WANDB_API_KEY=...
ENV WANDB_MODE=offline
CMD ["bash", "launch/pipeline.sh"]
