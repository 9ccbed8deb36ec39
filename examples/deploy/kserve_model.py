"""The model server a team already runs: a KServe Python ``ModelServer`` serving a modelward checkpoint over the
Open Inference Protocol v2 (REST), so that ``guard serve`` in proxy mode can stand in front of it.

    .venv-kserve/bin/python examples/deploy/kserve_model.py --checkpoint model.safetensors --name digits \
        --http-port 8081 [--output logits|probs] [--ssl-certfile cert.pem --ssl-keyfile key.pem]

The checkpoint is one written by ``modelward.extraction.guard.process.write_guard_config`` (its metadata names the
architecture). The model answers one output, ``logits`` (or ``probabilities`` with ``--output probs``), FP32
``[batch, classes]``. Run it from a virtual environment with ``kserve`` installed (KServe pins protobuf, pandas
and python-dateutil versions of its own, so it lives apart from modelward's environment: see
examples/deploy/README.md); it needs ``torch``, ``safetensors`` and modelward's ``src`` on ``PYTHONPATH`` (for the
architecture). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys

import kserve
import numpy as np
import torch
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
from safetensors import safe_open
from safetensors.torch import load_file


class CheckpointModel(kserve.Model):
    """A modelward checkpoint as a KServe model (``predict`` runs it on the request's ``input`` tensor)."""

    def __init__(self, name: str, checkpoint: str, input_shape: list[int], num_classes: int, output: str) -> None:
        super().__init__(name)
        self.checkpoint, self.input_shape, self.num_classes, self.output = checkpoint, input_shape, num_classes, output
        self.net: torch.nn.Module | None = None
        self.load()

    def load(self) -> bool:
        from modelward.core.zoo import ModelConfig, build_model

        with safe_open(self.checkpoint, framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("modelward", "{}"))
        net = build_model(ModelConfig(**meta.get("arch", {})), tuple(self.input_shape), self.num_classes)
        net.load_state_dict(load_file(self.checkpoint))
        self.net = net.eval()
        self.ready = True
        return self.ready

    async def predict(self, payload: InferRequest, headers: dict | None = None,
                      response_headers: dict | None = None) -> InferResponse:
        assert self.net is not None
        x = torch.from_numpy(np.ascontiguousarray(payload.inputs[0].as_numpy(), dtype=np.float32))
        with torch.no_grad():
            out = self.net(x.reshape(-1, *self.input_shape))
            if self.output == "probs":
                out = torch.softmax(out, dim=1)
        name = "probabilities" if self.output == "probs" else "logits"
        result = InferOutput(name=name, shape=list(out.shape), datatype="FP32")
        result.set_data_from_numpy(out.numpy().astype(np.float32), binary_data=False)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=[result])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--name", default="digits")
    p.add_argument("--input-shape", default="1,8,8")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--output", choices=["logits", "probs"], default="logits")
    p.add_argument("--http-port", type=int, default=8081)
    p.add_argument("--ssl-certfile")
    p.add_argument("--ssl-keyfile")
    a = p.parse_args(argv)
    sys.argv = sys.argv[:1]  # KServe parses the command line itself: keep ours out of it
    model = CheckpointModel(a.name, a.checkpoint, [int(d) for d in a.input_shape.split(",")], a.num_classes,
                            a.output)
    kserve.ModelServer(http_port=a.http_port, workers=1, enable_grpc=False, enable_latency_logging=False,
                       ssl_certfile=a.ssl_certfile, ssl_keyfile=a.ssl_keyfile).start([model])


if __name__ == "__main__":
    main()
