"""What the real-stack lab test converges (tests/converge/test_real_stack_lab.py): python_stack()
and the source builds whose wheels it installs, after the concerns they stand on (the box's
profile, the proxy's CA for PyPI, the CUDA env file the builds read, training.slice they run in)."""

from sparkrig.operations.ca_certificates import ca_certificates
from sparkrig.operations.cuda_env import cuda_env
from sparkrig.operations.hardware import hardware
from sparkrig.operations.jobs import jobs
from sparkrig.operations.python_stack import python_stack
from sparkrig.operations.source_builds import source_builds

hardware()
ca_certificates()
cuda_env()
jobs()
python_stack()
source_builds()
