"""NeMo Gym's own rollout collection against a parley resources server (run by
test_nemo_gym.py with the NeMo Gym virtual environment's Python: nemo-gym needs 3.12+).

``python nemo_gym_rollouts.py RESOURCES_URL POLICY_URL ROWS.jsonl OUT.jsonl``

NeMo Gym's ``gymnasium_agent`` and ``vllm_model`` servers (its code, unchanged) run here on
loopback ports: the model server turns the agent's Responses-API calls into chat completions
for ``POLICY_URL`` (``parley serve --http``), the agent plays each row against the parley
server at ``RESOURCES_URL``; ``RolloutCollectionHelper.run_examples`` (NeMo Gym's rollout
loop) posts the rows to the agent's ``/run``. What ``ng_run`` would add is starting these
servers in ``uv``-built environments and a head server holding their addresses, which needs
the network; the addresses are given to the servers' client here instead.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from nemo_gym.config_types import BaseServerConfig, ModelServerRef, ResourcesServerRef
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.server_utils import (
    GlobalAIOHTTPAsyncClientConfig,
    ServerClient,
    is_global_aiohttp_client_setup,
    set_global_aiohttp_client,
)
from omegaconf import OmegaConf
from responses_api_agents.gymnasium_agent.app import GymnasiumAgent, GymnasiumAgentConfig
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _serve(app: Any, port: int) -> uvicorn.Server:
    """``app`` served on this event loop (NeMo Gym's aiohttp client belongs to one loop)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    for _ in range(1200):  # 60 s
        if server.started:
            return server
        if task.done():
            break
        await asyncio.sleep(0.05)
    raise RuntimeError(f"NeMo Gym server on port {port} did not start")


class _Collection(RolloutCollectionHelper):
    """NeMo Gym's rollout loop with the servers' addresses given, not fetched from ng_run's
    head server."""

    client: Any = None

    def setup_server_client(self, head_server_config: Any = None) -> ServerClient:
        if not is_global_aiohttp_client_setup():
            cfg = GlobalAIOHTTPAsyncClientConfig.model_validate(self.client.global_config_dict)
            set_global_aiohttp_client(cfg=cfg)
        return self.client


def main(resources_url: str, policy_url: str, rows_path: str, out_path: str) -> None:
    resources = urlsplit(resources_url)
    agent_port, model_port = _port(), _port()
    servers = {
        "parley": ("resources_servers", "parley", resources.hostname, resources.port),
        "policy": ("responses_api_models", "vllm_model", "127.0.0.1", model_port),
        "agent": ("responses_api_agents", "gymnasium_agent", "127.0.0.1", agent_port),
    }
    global_config = OmegaConf.create(
        {
            name: {kind: {impl: {"host": host, "port": port, "entrypoint": "app.py"}}}
            for name, (kind, impl, host, port) in servers.items()
        }
    )
    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=_port()),
        global_config_dict=global_config,
    )
    model = VLLMModel(
        config=VLLMModelConfig(
            name="policy",
            host="127.0.0.1",
            port=model_port,
            entrypoint="app.py",
            base_url=policy_url,
            api_key="unused",
            model="tiny",
            return_token_id_information=False,
            uses_reasoning_parser=False,
        ),
        server_client=client,
    )
    agent = GymnasiumAgent(
        config=GymnasiumAgentConfig(
            name="agent",
            host="127.0.0.1",
            port=agent_port,
            entrypoint="app.py",
            resources_server=ResourcesServerRef(type="resources_servers", name="parley"),
            model_server=ModelServerRef(type="responses_api_models", name="policy"),
            max_steps=50,
        ),
        server_client=client,
    )
    with open(rows_path) as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    for row in rows:
        row["agent_ref"] = {"type": "responses_api_agents", "name": "agent"}
        params = row["responses_create_params"]
        params.update(temperature=0.0, max_output_tokens=6)

    async def collect() -> list[dict]:
        servers = [
            await _serve(model.setup_webserver(), model_port),
            await _serve(agent.setup_webserver(), agent_port),
        ]
        results = []
        try:
            for future in _Collection(client=client).run_examples(rows):
                try:
                    row, result = await future
                    results.append({"seed": row["seed"], "ok": True, "result": result})
                except Exception as error:  # a failed rollout is a result here
                    results.append({"ok": False, "error": f"{type(error).__name__}: {error}"})
        finally:
            for server in servers:  # stopped on their loop, before it closes
                server.should_exit = True
                await server.shutdown()
        return results

    results = asyncio.run(collect())
    with open(out_path, "w") as out:
        for result in results:
            out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:5])
