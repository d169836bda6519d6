# llmtrain with its training runtime on an official PyTorch CUDA image.
#   docker build -t llmtrain .
#   docker run --gpus all --rm llmtrain plan recipe=llama3-8b
# The base image already carries torch 2.13.0 built for CUDA, so pip keeps it (the train extra pins
# the same version) and only adds DeepSpeed and the CLI's own dependencies.
# Official image tags follow TORCH-cudaX.Y-cudnnN-{runtime,devel}; pick the CUDA your driver runs.
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-devel
FROM ${BASE_IMAGE}

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    DS_BUILD_OPS=0

WORKDIR /opt/llmtrain
COPY pyproject.toml README.md ./
COPY launcher ./launcher
COPY conf ./conf
COPY recipes ./recipes
RUN pip install ".[train]" && llmtrain --help >/dev/null

WORKDIR /workspace
ENTRYPOINT ["llmtrain"]
CMD ["--help"]
