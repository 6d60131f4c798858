"""
Parses ``vllm serve``'s arguments with the installed vLLM's own parser, as ``vllm serve``
does before it loads anything (vllm.entrypoints.openai.cli_args: make_arg_parser, then
validate_parsed_serve_args), and prints what it understood as JSON. Run by a venv's python
with -I: ``python -I vllm_serve_args.py ARG...`` (the words after ``serve``). A word the
parser refuses exits 2 with argparse's own message, as ``vllm serve`` would.

The parser's defaults come from the platform vLLM finds. Where it finds none (no GPU: the lab,
this controller), the parser is built with vLLM's own CPU platform (its CUDA platform needs the
driver's libcuda.so.1): the arguments are the same, only the device's defaults differ.
"""

import json
import sys

import vllm.platforms
from vllm.utils.import_utils import resolve_obj_by_qualname

if not vllm.platforms.current_platform.device_type:
    vllm.platforms.current_platform = resolve_obj_by_qualname("vllm.platforms.cpu.CpuPlatform")()
from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
args = parser.parse_args(sys.argv[1:])
args.subparser = "serve"
validate_parsed_serve_args(args)
plain = (str, int, float, bool, list, type(None))
print(json.dumps({key: value for key, value in vars(args).items() if isinstance(value, plain)}, default=str))
