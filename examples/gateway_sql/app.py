"""An SQL agent app as a team would write it: it knows nothing of evolvekit. It reads its users'
requests (one JSON object per line: ``{"user": ..., "prompt": ...}``, the prompt being the schema and
the question), asks a model for SQL through the `openai` client and a base URL, and writes the
answers (``{"user": ..., "sql": ..., "call_id": ...}``).

    python examples/gateway_sql/app.py --base-url http://127.0.0.1:4000/v1 --model sql-agent \\
        < requests.jsonl > answers.jsonl

Pointed at `evolve gateway`, its traffic is recorded, one session per user (the session header is
the one line that knows the gateway is there, and it is optional).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI


def clean(text: str) -> str:
    m = re.search(r"```(?:sql)?\s*(.*?)```", text or "", flags=re.S | re.I)
    return " ".join((m.group(1) if m else text or "").split()).rstrip(";")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", default="sql-agent")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=2)
    requests = [json.loads(line) for line in sys.stdin if line.strip()]

    def serve(req: dict) -> dict:
        r = client.chat.completions.create(
            model=args.model,
            messages=[{"role": "user", "content": req["prompt"]}],
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            extra_headers={"X-Evolve-Session": req["user"]},
        )
        return {
            "user": req["user"],
            "sql": clean(r.choices[0].message.content or ""),
            "call_id": r.id,
            "system": r.system_fingerprint,
        }

    with ThreadPoolExecutor(args.concurrency) as pool:
        for out in pool.map(serve, requests):
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
