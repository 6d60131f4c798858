"""sparkrig.atomic.Upload's real commands, run here through pyinfra's @local connector."""

from __future__ import annotations

import os
import stat
from io import BytesIO

from pyinfra.api import Config, Inventory, State
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.connect import connect_all
from pyinfra.context import ctx_host, ctx_state

from sparkrig.atomic import Upload


def test_a_new_file_lands_readable_by_root_alone_whatever_the_umask(tmp_path):
    """The login user's private directory, then root's copy with `umask 077`: a new file
    is 0600 until the caller sets its mode (a secret is never readable by others, even for a
    moment), under the common umask 022 too; the private directory is gone afterwards."""
    inventory = Inventory(([("@local", {})], {}))
    state = State(inventory, Config())
    connect_all(state)
    host = inventory.get_host("@local")
    arguments, _ = pop_global_arguments(state, host, {})
    connector = {key: arguments[key] for key in CONNECTOR_ARGUMENT_KEYS if key in arguments}
    # STAND-IN for SFTP: the @local connector copies from a 0600 temporary file, while an
    # SSH host's sftp-server creates the staged file 0644 (its umask 022); made so here.
    put_file = host.connector.put_file
    stages = []

    def put_as_sftp_does(src, staged, *args, **kwargs):
        stages.append(os.path.dirname(staged))
        done = put_file(src, staged, *args, **kwargs)
        os.chmod(staged, 0o644)
        return done

    host.connector.put_file = put_as_sftp_does
    dest = tmp_path / "secret.env"
    umask = os.umask(0o022)
    try:
        with ctx_state.use(state), ctx_host.use(host):
            assert Upload(BytesIO(b"TOKEN=x\n"), str(dest)).execute(state, host, connector)
    finally:
        os.umask(umask)
    assert dest.read_bytes() == b"TOKEN=x\n"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    # The stage itself, not a listing of /tmp: other tests (and the lab) make tmp.* beside it.
    assert len(stages) == 1 and stages[0].startswith("/tmp/tmp.")
    assert not os.path.lexists(stages[0])
