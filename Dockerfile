# syntax=docker/dockerfile:1.4
# EvSpark on a CPU, built from this repository with the bundled model and its drafters. The image
# (the `runtime` stage: a plain install, no test extra, no training state or sources) is
# produced only when the README's test command passes in the `test` stage (an editable install
# with the test extra; the suite needs nothing outside the repository):
#
#   docker build -t evspark:0.1.0 .
#   docker run --rm --user "$(id -u):$(id -g)" -v "$PWD:/data" -w /data evspark:0.1.0 \
#       evspark generate genome.fa --region chr1:1,000,001-1,004,000 -n 1024 -o cont.fa
#
# `--user` runs it as you, so the outputs in the mounted folder are yours (HOME and the caches
# are under /tmp, writable by any uid). torch comes from PyPI like every other dependency (its
# Linux wheel carries CUDA libraries that a CPU run leaves unused);
# `--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes the much smaller CPU-only
# build instead. docs/workflows.md has the details.

ARG PYTHON=3.11

FROM python:${PYTHON}-slim AS base
ARG TORCH=2.13.0
ARG TORCH_INDEX=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# samtools and bgzip (tabix) for the shell pipeline of examples/; g++ for --compile (torch.compile)
RUN apt-get update \
 && apt-get install -y --no-install-recommends samtools tabix g++ procps \
 && rm -rf /var/lib/apt/lists/*
RUN pip install ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "torch==${TORCH}"
WORKDIR /opt/evspark

# the suite: the repository installed editable with its test extra, then the README's test command
FROM base AS test
COPY . .
RUN pip install -e ".[test]"
RUN ruff check . && python -m pytest -q -x -p no:cacheprovider && touch /opt/evspark/.tested

# the image: the package installed from the repository (not editable, no test extra) beside the
# torch of `base`; it is built only once the test stage has passed
FROM base AS runtime
COPY --from=test /opt/evspark/.tested /opt/evspark/.tested
RUN --mount=type=bind,target=/tmp/evspark-src,rw pip install /tmp/evspark-src
# any uid may run it (`docker run --user "$(id -u):$(id -g)"`): HOME and the caches are writable
ENV HOME=/tmp XDG_CACHE_HOME=/tmp/.cache
WORKDIR /data
ENTRYPOINT []
CMD ["evspark", "--help"]
