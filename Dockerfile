# MetaKernelBench image: both DSL toolchains, the problem set, docs and templates; entrypoint `mkb`.
#
#   make image                      # production: CUDA 13 devel base (pinned by digest), Python 3.12
#   docker run --gpus all --security-opt seccomp=unconfined --security-opt systempaths=unconfined \
#     -e OPENROUTER_API_KEY -v $PWD/results:/results mkb run-model openrouter/<model>
#
# The judge grades every kernel in a bubblewrap sandbox of its own (user, mount, PID and network
# namespaces; docs/judge.md). Docker's default seccomp profile refuses the namespaces, and its masked
# /proc paths refuse a fresh /proc: the two --security-opt flags above let the sandbox start (add
# --security-opt apparmor=unconfined where AppArmor is on). Without them every grading is an
# infra_error that says so, and `mkb doctor` reports the judge sandbox as failed.
#
# Python packages come only from build/wheelhouse (made on the host by scripts/wheelhouse.sh from the
# hash-locked requirements.lock), so the build needs no registry. CI builds the same file with
# --build-arg BASE=local/debian:bookworm (a debootstrapped base; no registry is reachable there).
ARG BASE=nvidia/cuda:13.0.1-devel-ubuntu24.04@sha256:7d2f6a8c2071d911524f95061a0db363e24d27aa51ec831fcccf9e76eb72bc92
FROM ${BASE}

ARG TORCH_SPEC=torch==2.11.0
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
    MKB_HOME=/results VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH

RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates gcc libc6-dev bubblewrap \
 && rm -rf /var/lib/apt/lists/*

COPY build/wheelhouse /tmp/wheelhouse
COPY requirements.lock /tmp/requirements.lock
RUN python3 -m venv /opt/venv \
 && pip install -q --no-index --find-links /tmp/wheelhouse "${TORCH_SPEC}" \
 && pip install -q --no-index --find-links /tmp/wheelhouse --require-hashes --no-deps -r /tmp/requirements.lock \
 && rm -rf /tmp/wheelhouse

COPY pyproject.toml README.md /opt/mkb/
COPY mkb /opt/mkb/mkb
COPY problems /opt/mkb/problems
COPY docs /opt/mkb/docs
COPY artifact /opt/mkb/artifact
COPY tests /opt/mkb/tests
COPY scripts /opt/mkb/scripts
RUN pip install -q --no-index --no-deps --no-build-isolation -e /opt/mkb && pip check \
 && useradd --create-home --uid 1000 mkb && mkdir -p /results && chown mkb /results
# The agents' API reference, generated from the installed DSLs (never committed: upstream docstrings).
RUN mkb docs build

# Build-time smoke test: both DSLs import and compile a kernel for sm_90a (no GPU needed).
USER mkb
RUN if command -v nvcc >/dev/null; then export TVM_CUDA_COMPILE_MODE=nvcc; fi; python -m mkb.dsl_smoke --arch sm_90a

WORKDIR /opt/mkb
VOLUME /results
ENTRYPOINT ["mkb"]
CMD ["--help"]
