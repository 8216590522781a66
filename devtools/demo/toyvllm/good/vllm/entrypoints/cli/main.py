"""The `vllm` command line: `vllm serve MODEL [options]`."""

import argparse
import sys


def make_parser():
    parser = argparse.ArgumentParser(prog="vllm", description="vLLM CLI (toy build)")
    parser.add_argument("-v", "--version", action="store_true")
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="Start the vLLM OpenAI compatible API server.")
    serve.add_argument("model_tag")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--enforce-eager", action="store_true")
    serve.add_argument("--load-format", default="auto")
    serve.add_argument("--served-model-name", default=None)
    serve.add_argument("--trust-remote-code", action="store_true")
    return parser


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.version:
        from vllm.version import __version__
        print(__version__)
        return 0
    if args.command != "serve":
        parser.print_help()
        return 2
    from vllm.entrypoints.openai.api_server import run_server
    return run_server(args)


if __name__ == "__main__":
    sys.exit(main())
