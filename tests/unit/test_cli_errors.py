"""Bad input ends in one line on stderr and exit 2, never a traceback."""

import pytest

from pycli.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cluster", "up", "--nodes", "0"], "--nodes must be between 1 and 64"),
        (["cluster", "up", "--nodes", "two"], "Invalid value for '--nodes'"),
        (["cluster", "up", "--name", "Bad_Name"], "cluster name 'Bad_Name'"),
        (["cluster", "up", "--slots", "0"], "--slots must be 1 or more processes per node, got 0"),
        (["cluster", "up", "--slots", "four"], "Invalid value for '--slots'"),
        (["cluster", "up", "--bogus"], "No such option: --bogus"),
        (["cluster", "down", "--name", "x_y"], "cluster name"),
        (["cluster", "image", "--ca-bundle", "/nonexistent.pem"], "cannot read CA bundle"),
        (["no-such-command"], "No such command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("pycli: error: ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("pycli ")


def test_controller_and_its_old_name_backend():
    from pycli.cli_options import controller_option
    from pycli.errors import BadInput

    assert controller_option(None, None) == "gloo"
    assert controller_option("mpi", None) == controller_option(None, "mpi") == controller_option("mpi", "mpi") == "mpi"
    with pytest.raises(BadInput, match="unknown --controller 'nccl'"):
        controller_option("nccl", None)
    with pytest.raises(BadInput, match="unknown --backend 'nccl'"):
        controller_option(None, "nccl")
    with pytest.raises(BadInput, match="--controller mpi and --backend gloo disagree"):
        controller_option("mpi", "gloo")
