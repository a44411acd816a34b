"""``runner.params.model_server`` without a cluster: what the ray runner accepts and refuses, and
the actor options each server gets (one per base by default, one per role with ``servers:
per_role``). The servers themselves, on a two-node cluster, are in test_ray_runner.py (slow)."""

from __future__ import annotations

import pytest

from evolve.cluster.model_server import per_role, role_server_name, server_name, server_options
from evolve.errors import ConfigError
from evolve.runners.ray_runner import RayRunner


def test_the_default_is_one_server_per_base_with_the_options_it_always_had():
    r = RayRunner(model_server={"num_cpus": 0.5, "resources": {"head": 0.01}})
    assert not per_role(r.model_server) and not per_role(None)
    assert server_options(r.model_server) == {
        "num_cpus": 0.5,
        "num_gpus": 0.0,
        "resources": {"head": 0.01},
        "max_concurrency": 256,
    }
    assert RayRunner(model_server=True).model_server == {}


def test_a_roles_own_keys_replace_the_shared_ones_for_its_server_only():
    ms = {
        "servers": "per_role",
        "num_cpus": 2,
        "resources": {"a": 1},
        "roles": {"solver": {"num_gpus": 1, "resources": {"big": 1}}, "verifier": {"max_concurrency": 8}},
    }
    RayRunner(model_server=ms)
    assert per_role(ms)
    assert server_options(ms, "solver") == {
        "num_cpus": 2.0,
        "num_gpus": 1.0,
        "resources": {"big": 1},
        "max_concurrency": 256,
    }
    assert server_options(ms, "verifier") == {
        "num_cpus": 2.0,
        "num_gpus": 0.0,
        "resources": {"a": 1},
        "max_concurrency": 8,
    }
    assert server_options(ms, "writer") == server_options(ms)  # a role not listed: the shared settings
    # a run's role servers share its prefix, which is what the runner kills when it closes
    assert role_server_name("/runs/x", "solver").startswith(server_name("/runs/x", ""))
    assert role_server_name("/runs/x", "solver") != role_server_name("/runs/y", "solver")


@pytest.mark.parametrize(
    ("ms", "match"),
    [
        ({"num_gpu": 1}, r"runner.params.model_server: takes no key 'num_gpu'; it takes num_cpus"),
        ({"servers": "per_node"}, r"model_server.servers: must be one of \['per_base', 'per_role'\]"),
        ({"roles": {"solver": {}}}, r"model_server.roles: sets each role's own server: it needs servers: per_role"),
        ({"servers": "per_role", "roles": ["solver"]}, r"model_server.roles: must be a mapping of role names"),
        (
            {"servers": "per_role", "roles": {"solver": {"gpus": 1}}},
            r"model_server.roles.solver: takes no key 'gpus'; a role's server takes num_cpus",
        ),
        (
            {"servers": "per_role", "roles": {"solver": {"resources": {"a": -1}}}},
            r"roles.solver: a must be a number >= 0",
        ),
        ({"num_cpus": "two"}, r"num_cpus must be a number >= 0, got 'two'"),
        ({"max_concurrency": 0}, r"max_concurrency must be a whole number >= 1"),
    ],
)
def test_a_model_server_setting_the_servers_cannot_honour_is_refused_before_the_run(ms, match):
    with pytest.raises(ConfigError, match=match):
        RayRunner(model_server=ms)
