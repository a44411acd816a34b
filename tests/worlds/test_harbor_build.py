"""Building Harbor tasks' images on a real engine (evolve/worlds/harbor/environment/build.py): the image map for
bases no registry gives here, BuildKit heredocs on an engine without BuildKit, builds that reach the
package mirror through the host network only when the user opts in, and failed builds that leave
nothing behind."""

from __future__ import annotations

import base64
import re

import pytest

from evolve.worlds.harbor.environment.build import BuildfileError, rewrite

HEREDOCS = """# syntax=docker/dockerfile:1
FROM ubuntu:24.04
RUN <<EOF
set -e
echo "home $HOME" > /hi.txt
EOF
RUN <<'EOF'
#!/bin/sh
echo '$NOT_EXPANDED' > /raw.txt
EOF
RUN python3 <<'PY' > /py.txt
print("x" * 3)
PY
COPY --chmod=600 <<EOF /etc/app/conf.ini
[a]
home=$HOME
EOF
COPY <<A <<B /etc/two/
one
A
two
B
WORKDIR /app
"""


def _scripts(text: str) -> list[str]:
    return [base64.b64decode(b).decode() for b in re.findall(r"printf %s (\S+) \| base64 -d", text)]


def test_heredocs_become_plain_run_lines_and_the_image_map_applies():
    out = rewrite(HEREDOCS, {"ubuntu:24.04": "local/ubuntu"})
    assert "<<" not in "\n".join(line for line in out.splitlines() if not line.startswith("RUN printf"))
    assert out.splitlines()[1] == "FROM local/ubuntu" and out.rstrip().endswith("WORKDIR /app")
    bare, shebang, python, conf, two = _scripts(out)
    assert bare == 'set -e\necho "home $HOME" > /hi.txt\n'  # the body alone, run by the shell
    assert shebang.startswith("#!/bin/sh") and "chmod +x" in out.splitlines()[3]  # run as a script
    assert python == "python3 <<'PY' > /py.txt\nprint(\"x\" * 3)\nPY\n"  # the command with its heredoc
    assert "cat > /etc/app/conf.ini <<EOF\n[a]\nhome=$HOME\nEOF" in conf and "chmod 600 /etc/app/conf.ini" in conf
    assert "cat > /etc/two/A <<A\none\nA" in two and "cat > /etc/two/B <<B\ntwo\nB" in two
    assert (
        rewrite("FROM python:3.11-slim AS b\nCOPY --from=python:3.11-slim /x /y\n", {"python:3.11-slim": "p"})
        == "FROM p AS b\nCOPY --from=p /x /y\n"
    )
    assert rewrite("FROM ubuntu\n", {"ubuntu:latest": "u"}) == "FROM u\n"  # no tag: latest


def test_forms_it_cannot_build_are_refused_naming_the_line():
    with pytest.raises(BuildfileError, match="line 2: the heredoc <<EOF is never closed"):
        rewrite("FROM x\nRUN <<EOF\necho\n")
    with pytest.raises(BuildfileError, match=r"line 2: COPY with a heredoc and --link is not built here"):
        rewrite("FROM x\nCOPY --link <<EOF /a\nb\nEOF\n")
    with pytest.raises(BuildfileError, match="line 2: a heredoc in RUN's exec form"):
        rewrite('FROM x\nRUN ["sh", "<<EOF"]\nb\nEOF\n')


# ----------------------------------------------------------------------------- on a real engine


def _task(tmp_path, name: str, dockerfile: str, test: str, solve: str, files: dict | None = None):
    d = tmp_path / name
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "instruction.md").write_text("Do it.")
    (d / "task.toml").write_text(
        "[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 60\n[environment]\nbuild_timeout_sec = 600\n"
    )
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    for k, v in (files or {}).items():
        (d / "environment" / k).write_text(v)
    (d / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve)
    return d


def _episode(engine, folder, *, solve: bool = True, **more) -> dict:
    from evolve.worlds.harbor.environment.docker import DockerEnvironment

    env = DockerEnvironment(engine.task(folder, **more), engine.client)
    try:
        if solve:
            env.solve()
        return env.verify()
    finally:
        env.close()


def test_public_shapes_build_on_the_engine_here(docker_engine, tmp_path):
    """RUN before WORKDIR, ENV PATH=...:$PATH, heredocs and an ubuntu base (through the image map)."""
    d = _task(
        tmp_path,
        "shapes",
        dockerfile=(
            "FROM ubuntu:24.04\n"
            "RUN mkdir -p /opt/tool/bin && printf '#!/bin/sh\\necho tool-ok\\n' > /opt/tool/bin/tool && "
            "chmod +x /opt/tool/bin/tool\n"
            "ENV PATH=/opt/tool/bin:$PATH\n"
            + HEREDOCS.split("\n", 2)[2].replace("RUN python3 <<'PY' > /py.txt\nprint(\"x\" * 3)\nPY\n", "")
            + "COPY data.txt /app/\n"
        ),
        files={"data.txt": "7\n"},
        test=(
            'ok=1; [ "$(tool)" = tool-ok ] || ok=0; [ "$(cat /hi.txt)" = "home /root" ] || ok=0\n'
            "[ \"$(cat /raw.txt)\" = '$NOT_EXPANDED' ] || ok=0; grep -q home=/root /etc/app/conf.ini || ok=0\n"
            '[ "$(stat -c %a /etc/app/conf.ini)" = 600 ] || ok=0; [ "$(cat /etc/two/A /etc/two/B)" = "$(printf '
            "'one\\ntwo')\" ] || ok=0\n"
            '[ "$(cat /app/data.txt)" = 7 ] && [ "$(pwd)" = /app ] || ok=0; echo $ok > /logs/verifier/reward.txt\n'
        ),
        solve="true\n",
    )
    got = _episode(docker_engine, d)
    assert got["score"] == 1.0, got


def test_a_build_reaches_the_package_mirror_through_the_host_network_only_when_the_user_opts_in(
    docker_engine, tmp_path
):
    from evolve.worlds.harbor.environment.outcome import EnvironmentError_

    d = _task(
        tmp_path,
        "apt",
        dockerfile="FROM debian:bookworm\nRUN apt-get update -q && apt-get install -y -q "
        "--no-install-recommends jq && rm -rf /var/lib/apt/lists/*\nWORKDIR /app\n",
        test="echo '{\"a\": 1}' | jq -e '.a == 1' && echo 1 > /logs/verifier/reward.txt\n",
        solve="true\n",
    )
    if "bridge" not in {n.name for n in docker_engine.client.networks.list()}:  # the engine the tests start
        with pytest.raises(EnvironmentError_, match="the build ran without a network") as e:
            _episode(docker_engine, d)
        assert "dataset.params.build_network: host" in e.value.reason and "dataset.params.images" in e.value.reason
    assert _episode(docker_engine, d, build_network="host")["score"] == 1.0


def test_a_failed_build_is_the_tasks_environment_failing_and_leaves_no_container(docker_engine, tmp_path):
    from evolve.worlds.harbor.environment.outcome import EnvironmentError_

    before = {c.id for c in docker_engine.client.containers.list(all=True)}
    d = _task(
        tmp_path,
        "fails",
        dockerfile="FROM debian:bookworm\nRUN echo building && exit 3\nWORKDIR /app\n",
        test="echo 1 > /logs/verifier/reward.txt\n",
        solve="true\n",
    )
    with pytest.raises(EnvironmentError_, match="docker build of environment/ failed"):
        _episode(docker_engine, d)
    assert {c.id for c in docker_engine.client.containers.list(all=True)} == before
    bad = _task(
        tmp_path, "open-heredoc", dockerfile="FROM debian:bookworm\nRUN <<EOF\necho\n", test="true\n", solve="true\n"
    )
    with pytest.raises(EnvironmentError_, match="heredoc <<EOF is never closed") as e:
        _episode(docker_engine, bad)
    assert e.value.status == "unsupported"
