"""--signal as in Slurm: without B: the warning goes to the command's children (Slurm's steps),
or to the command itself when it runs no children; with B: to the main process only. A
shell that runs the program is never killed by the default."""

from __future__ import annotations

# A program that notes the warning in a file and ends on its own.
HANDLER = (
    "import signal, sys, time\n"
    "def warned(*_):\n"
    "    open('{name}', 'w').write('warned')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGUSR1, warned)\n"
    "time.sleep(120)\n"
)


def test_default_signal_reaches_the_program_not_the_shell_around_it(home, tmp_path):
    # Before: the whole process group got SIGUSR1 and the shell died of it (failed, 10).
    home.start()
    script = HANDLER.format(name=tmp_path / "program")
    job_id = home.submit(
        "--time",
        "0:40",
        "--signal",
        "USR1@38",
        "--",
        "sh",
        "-c",
        f'python3 -c "{script}"; echo shell went on',
    )
    job = home.wait_state(job_id, "succeeded", "failed", "timeout")
    assert (job["state"], job["exit_code"], job["signal"]) == ("succeeded", 0, None)
    assert (tmp_path / "program").read_text() == "warned"
    assert "shell went on" in home.run("logs", str(job_id)).stdout


def test_default_signal_reaches_a_program_run_directly(home, tmp_path):
    home.start()
    job_id = home.submit(
        "--time",
        "0:40",
        "--signal",
        "USR1@38",
        "--",
        "python3",
        "-c",
        HANDLER.format(name=tmp_path / "program"),
    )
    assert home.wait_state(job_id, "succeeded", "failed", "timeout")["state"] == "succeeded"
    assert (tmp_path / "program").exists()


def test_batch_signal_goes_to_the_main_process_only(home, tmp_path):
    home.start()
    child = HANDLER.format(name=tmp_path / "child")
    shell = f"trap 'echo main > {tmp_path / 'main'}; exit 7' USR1; python3 -c \"{child}\" & wait"
    job_id = home.submit("--time", "0:40", "--signal", "B:USR1@38", "--", "sh", "-c", shell)
    job = home.wait_state(job_id, "succeeded", "failed", "timeout")
    assert (job["state"], job["exit_code"]) == ("failed", 7)
    assert (tmp_path / "main").exists()
    assert not (tmp_path / "child").exists()  # Slurm's B: spares the steps
