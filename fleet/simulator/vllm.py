"""`python -m fleet.simulator.vllm serve MODEL ...`: what a simulated serving box runs for `vllm serve`, on the standard
library only (docs/fleet.md, "fleet/simulator/vllm.py")."""

import argparse
import json
import os
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MAX_MODEL_LEN = 256
PORTS_ENV = "FLEET_SIM_PORTS"  # set by fleet/simulator/agents.py for each box
GPUS_ENV = "FLEET_SIM_NUM_GPUS"  # likewise: the GPUs the box was rented with


class StartError(Exception):
    """What vLLM would print before exiting instead of serving."""


def lora_module(text: str) -> dict:
    """One --lora-modules value: `name=path` or `{"name": ..., "path": ..., "base_model_name": ...}`."""
    if text.lstrip().startswith("{"):
        module = json.loads(text)
        if not module.get("name") or not module.get("path"):
            raise argparse.ArgumentTypeError(f"a LoRA module needs a name and a path: {text}")
        return module
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"a LoRA module is name=path: {text}")
    return {"name": name, "path": path}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve")
    serve.add_argument("model")
    serve.add_argument("--host", default="0.0.0.0")  # noqa: S104 (what vLLM defaults to; the simulation binds loopback)
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", nargs="+")
    serve.add_argument("--enable-lora", action="store_true")
    serve.add_argument("--max-lora-rank", type=int, default=16, choices=RANKS)
    serve.add_argument("--lora-modules", nargs="+", type=lora_module, default=[])
    serve.add_argument("--tensor-parallel-size", type=int, default=1)
    args, _ = parser.parse_known_args(argv)
    return args


def models_list(base: str, root: str, loras: list[dict], created: int) -> dict:
    """The body of GET /v1/models, shaped as vLLM's (serving_models.show_available_models)."""
    def card(model_id, model_root, parent=None, max_len=None):
        return {"id": model_id, "object": "model", "created": created, "owned_by": "vllm", "root": model_root,
                "parent": parent, "max_model_len": max_len,
                "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                "created": created, "allow_create_engine": False, "allow_sampling": True,
                                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                "allow_fine_tuning": False, "organization": "*", "group": None,
                                "is_blocking": False}]}

    return {"object": "list", "data": [card(base, root, max_len=MAX_MODEL_LEN)]
            + [card(m["name"], m["path"], m.get("base_model_name") or base) for m in loras]}


def check_adapters(args: argparse.Namespace) -> None:
    if args.lora_modules and not args.enable_lora:
        raise StartError("LoRA modules were given without --enable-lora")
    for module in args.lora_modules:
        folder = Path(module["path"])
        missing = [name for name in ADAPTER_FILES if not (folder / name).is_file()]
        if missing:
            raise StartError(f"No adapter found for {module['name']} at {folder}: {', '.join(missing)} missing")
        rank = json.loads((folder / "adapter_config.json").read_text())["r"]
        if rank > args.max_lora_rank:
            raise StartError(f"LoRA rank {rank} is greater than max_lora_rank {args.max_lora_rank}")


def bound_port(container_port: int) -> int:
    ports = json.loads(os.environ.get(PORTS_ENV) or "{}")
    return int(ports.get(f"{container_port}/tcp", container_port))


def check_gpus(args: argparse.Namespace) -> None:
    """vLLM's own refusal of a tensor-parallel size larger than the GPUs it sees (the box's, GPUS_ENV)."""
    gpus = int(os.environ.get(GPUS_ENV) or 1)
    if not 1 <= args.tensor_parallel_size <= gpus:
        raise StartError(f"World size ({args.tensor_parallel_size}) is larger than the number of available GPUs "
                         f"({gpus}) in this node")


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        check_gpus(args)
        check_adapters(args)
    except (StartError, OSError, ValueError, KeyError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 1
    base = (args.served_model_name or [args.model])[0]
    body = json.dumps(models_list(base, args.model, args.lora_modules, int(time.time()))).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            found = self.path.split("?")[0] == "/v1/models"
            status, payload = (200, body) if found else (404, b'{"detail":"Not Found"}')
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", bound_port(args.port)), Handler)
    print(f"INFO: serving {base} with {len(args.lora_modules)} LoRA adapter(s), tensor-parallel over "
          f"{args.tensor_parallel_size} GPU(s), on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
