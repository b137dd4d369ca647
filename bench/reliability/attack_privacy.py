"""Another user's private facts in system mode (issue 32, item 9): Bob runs every command
that reads, in every form, and counts each answer that holds what only Alice may see of
her jobs (their name, command, directory, environment) or of her service (its command,
directory, environment)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from reliability.harness import Figures, poll
from reliability.unauthorized import _alice_jobs, system_and_two_users

# What _alice_jobs puts in her jobs: their name, directory, environment and command.
SECRETS = ("alice-secret-name", "secret-project", "s3cr3t")
FIELDS = "jobid,jobarrayid,name,user,state,reason,exitcode,dependency,progress,workdir,command"


def _reads(targets: dict[str, str], small: bool) -> list[tuple[str, ...]]:
    jobs = list(targets.values())
    reads = [
        ("ls",),
        ("ls", "--json"),
        ("ls", "--all", "--json"),
        ("ls", "-r"),
        ("ls", "--all", "--format", FIELDS),
        ("show", *jobs),
        ("show", "--json", *jobs),
        ("usage", "--by", "name"),
        ("usage", "--by", "name", "--json"),
        ("gpus", "--json"),
        ("top", "--once"),
        ("daemon", "status", "--json"),
        ("service", "ls", "--json"),
        ("service", "show", "--json", "alices"),
    ]
    if not small:
        reads += [
            ("ls", "--all", "-r", "--json"),
            ("ls", "--last", "9"),
            ("gpus",),
            ("usage",),
            ("usage", "--json"),
            ("service", "ls"),
            ("service", "show", "alices"),
        ]
    return reads


def measure(small: bool) -> Figures:
    fig = Figures("another user's private facts (system mode)")
    fig.counts["leaks"] = 0
    with system_and_two_users(fig) as found:
        if found is None:
            return fig
        system, alice, bob = found
        targets = _alice_jobs(system, alice)
        if "running" in targets:  # a running job is counted by usage, and is on a GPU
            poll(
                lambda: (
                    '"running"' in system.as_user(None, "show", "--json", targets["running"]).stdout
                ),
                30,
            )
        made = system.as_user(
            alice,
            "service",
            "create",
            "alices",
            "--cwd",
            f"{alice.pw_dir}/secret-project",
            "--",
            "sh",
            "-c",
            "sleep 300",
            "s3cr3t",
            env={"SECRET": "s3cr3t"},
        )
        fig.info["service"] = (
            "made" if made.returncode == 0 else f"not made: {made.stderr.strip()[:120]}"
        )
        reads = _reads(targets, small)

        def read(args: tuple[str, ...]) -> None:
            done = system.as_user(bob, *args)
            said = done.stdout + done.stderr
            if any(secret in said for secret in SECRETS):
                fig.fail("leaks", " ".join(args))

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(read, reads))
        fig.info["reads"] = len(reads)
        # Alice's own answers hold them: the reads above would have shown a leak.
        fig.info["owner_sees_own"] = all(
            SECRETS[0] in system.as_user(alice, *args).stdout
            for args in (("ls", "--json"), ("usage", "--by", "name"))
        )
    return fig
