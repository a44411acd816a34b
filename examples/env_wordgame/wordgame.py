"""A small OpenEnv-style environment server: guess a secret five-letter word (Wordle-style marks).

It speaks the two protocols ``world: env`` (:mod:`evolve.worlds.env`) can drive:

* **WebSocket** ``/ws``, the OpenEnv protocol: one episode per connection; the client sends
  ``{"type": "reset", "data": {"seed": 7}}``, ``{"type": "step", "data": {"message": "crane"}}``,
  ``{"type": "state"}`` or ``{"type": "close"}``; the server answers
  ``{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}``,
  ``{"type": "state", "data": {...}}`` or ``{"type": "error", "data": {"message": ..., "code": ...}}``
  (codes as OpenEnv's: ``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR``, ``EXECUTION_ERROR``);
* **HTTP**: ``POST /reset`` with ``{"seed": 7}`` answers ``{"observation", "reward", "done",
  "session_id"}``; ``POST /step`` with ``{"action": {"message": "crane"}, "session_id": ...}``
  answers ``{"observation", "reward", "done"}``. Unlike a stock OpenEnv server (whose HTTP
  ``/reset`` and ``/step`` build a fresh environment per request), the episode is kept between
  calls under its ``session_id``. A bad action is HTTP 422 (``{"detail": ...}``), an unknown
  session 404. ``GET /health``, ``/metadata``, ``/schema`` (the action's JSON schema) and
  ``/state?session_id=...`` are there too.

The game: ``reset(seed)`` picks the secret from :data:`WORDS` (the same word for the same seed).
An action is ``{"message": text}`` (the guess is the last run of exactly five letters in the
text, so "my guess: crane" works) or ``{"guess": "crane"}``. Each guess is marked letter by
letter: ``G`` right letter in the right place, ``Y`` in the word elsewhere, ``.`` not in it
(repeated letters counted as in Wordle). A text without a five-letter word is an invalid guess:
it uses up a turn and is marked ``?????``. There are 6 guesses (``reset`` takes
``max_guesses`` too). The reward is 0 for every guess but a winning one, which earns
``(max_guesses - guesses_used + 1) / max_guesses`` (1.0 on the first guess, 1/6 on the sixth), so
an episode's return lies in [0, 1]. The episode is done when the word is found or the guesses
are used up.

Run it::

    python examples/env_wordgame/wordgame.py --port 8000        # or: uvicorn wordgame:app --app-dir examples/env_wordgame

or let the world start it: ``dataset: {params: {server: "wordgame:app"}}`` (``task.yaml`` here).

:func:`player` is a scripted stand-in for a model (the ``scripted`` backend's ``reply``): it reads
the board from the last observation and, when its instruction tells it to use the feedback,
guesses a word that fits every mark so far; otherwise it guesses from a fixed list. It is a
fixture for offline runs and tests, not a learning result.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import threading
import uuid
from collections import OrderedDict
from typing import Any

WORDS = tuple(
    """
about above actor acute admit adopt adult after again agent agree ahead alarm album alert alike alive allow
alone along alter among anger angle angry apart apple apply arena argue arise array aside asset audio avoid
award aware badly baker basic beach begin being below bench birth black blade blame blind block blood board
boost booth bound brain brand bread break breed brief bring broad brown build built buyer cabin cable candy
carry catch cause chain chair chart chase cheap check chest chief child china chose civil claim class clean
clear click clock close coach coast could count court cover craft crane crash cream crime cross crowd crown
curve cycle daily dance dated dealt death debut delay depth doing doubt dozen draft drama drawn dream dress
drink drive eager early earth eight elite empty enemy enjoy enter entry equal error event every exact exist
extra faith false fault fiber field fifth fifty fight final first flash fleet floor fluid focus force forth
forty forum found frame frank fraud fresh front fruit fully funny giant given glass globe going grace grade
grand grant grass great green gross group grown guard guess guest guide happy heart heavy hello horse hotel
house human ideal image index inner input issue joint judge juice knife known label large laser later laugh
layer learn lease least leave legal lemon level light limit lived local logic loose lucky lunch magic major
maker march match maybe mayor meant media metal might minor mixed model money month moral motor mount mouse
mouth movie music needs never newly night noise north noted novel nurse ocean offer often order other ought
paint panel paper party peace phase phone photo piano piece pilot pitch place plain plane plant plate point
pound power press price pride prime print prior prize proof proud prove queen quick quiet quite radio raise
range rapid ratio reach ready refer relax reply right rival river robot rough round route royal rural salad
scale scene scope score sense serve seven shall shape share sharp sheet shelf shell shift shirt shock shoot
short shown sight since sixth skill sleep slide small smart smile smoke solid solve sound south space spare
speak speed spend spent split sport staff stage stake stand start state steam steel stick still stock stone
stood store storm story strip stuck study stuff style sugar suite super sweet table taken taste teach thank
theme there thick thing think third those three threw throw tight timer tired title today topic total touch
tough tower track trade train treat trend trial tried truck truly trust truth twice under union unity until
upper upset urban usage usual valid value video virus visit vital voice waste watch water wheel where which
while white whole whose woman world worry worse worst worth would wound write wrong wrote yield young youth
""".split()
)
assert len(set(WORDS)) == len(WORDS) and all(len(w) == 5 and w.isalpha() for w in WORDS)

MAX_GUESSES = 6
_FIVE = re.compile(r"(?<![A-Za-z])[A-Za-z]{5}(?![A-Za-z])")

RULES = (
    "Guess the secret five-letter English word. After each guess you get one mark per letter: "
    "G = right letter in the right place, Y = in the word but elsewhere, . = not in the word. "
    "You have {n} guesses. Reply with one five-letter word."
)


def marks(secret: str, guess: str) -> str:
    """The Wordle marks of ``guess`` against ``secret`` (both five lower-case letters)."""
    out = ["."] * 5
    left: dict[str, int] = {}
    for i, (s, g) in enumerate(zip(secret, guess)):
        if s == g:
            out[i] = "G"
        else:
            left[s] = left.get(s, 0) + 1
    for i, g in enumerate(guess):
        if out[i] != "G" and left.get(g, 0) > 0:
            out[i] = "Y"
            left[g] -= 1
    return "".join(out)


def guess_of(text: str) -> str | None:
    """The guess in a message: its last run of exactly five letters, lower-cased, or None."""
    found = _FIVE.findall(text or "")
    return found[-1].lower() if found else None


class Game:
    """One episode."""

    def __init__(self, seed: int | None = None, max_guesses: int = MAX_GUESSES) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if isinstance(max_guesses, bool) or not isinstance(max_guesses, int) or not 1 <= max_guesses <= 20:
            raise ValueError(f"max_guesses must be an integer from 1 to 20, got {max_guesses!r}")
        self.seed = seed
        self.secret = random.Random(seed).choice(WORDS) if seed is not None else random.choice(WORDS)
        self.max_guesses = max_guesses
        self.board: list[tuple[str, str]] = []  # (guess as typed, marks)
        self.won = False
        self.message = "New game."

    @property
    def done(self) -> bool:
        return self.won or len(self.board) >= self.max_guesses

    def step(self, action: dict[str, Any]) -> tuple[dict[str, Any], float, bool]:
        if self.done:
            raise RuntimeError("the episode is over; reset to play again")
        text = action.get("guess", action.get("message"))
        guess = guess_of(text)
        if guess is None:
            self.board.append((str(text)[:20], "?????"))
            self.message = f"{str(text)[:40]!r} has no five-letter word: a turn lost."
        else:
            m = marks(self.secret, guess)
            self.board.append((guess, m))
            self.won = m == "GGGGG"
            self.message = "Solved!" if self.won else f"{guess}: {m}"
        reward = (self.max_guesses - len(self.board) + 1) / self.max_guesses if self.won else 0.0
        if self.done and not self.won:
            self.message += f" No guesses left; the word was {self.secret!r}."
        return self.observation(), reward, self.done

    def observation(self) -> dict[str, Any]:
        n = len(self.board)
        lines = [RULES.format(n=self.max_guesses)]
        if self.board:
            lines.append("Your guesses so far:")
            lines += [f"  {g} {' '.join(m)}" for g, m in self.board]
        if self.won:
            lines.append(f"Solved in {n} guess{'es' if n != 1 else ''}.")
        elif self.done:
            lines.append(f"No guesses left; the word was {self.secret!r}.")
        else:
            lines.append(f"Guess {n + 1} of {self.max_guesses}:")
        return {
            "prompt": "\n".join(lines),
            "board": [{"guess": g, "marks": m} for g, m in self.board],
            "guesses_left": self.max_guesses - n,
            "won": self.won,
            "message": self.message,
        }

    def state(self) -> dict[str, Any]:
        return {"episode_id": None, "step_count": len(self.board), "seed": self.seed, "done": self.done}


# ----------------------------------------------------------------------------- the action contract

ACTION_SCHEMA = {
    "title": "WordGameAction",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "message": {"type": "string", "description": "text whose last five-letter word is the guess"},
        "guess": {"type": "string", "description": "the guess itself"},
        "metadata": {"type": "object"},
    },
}


def check_action(action: Any) -> dict[str, Any]:
    """The action if it fits :data:`ACTION_SCHEMA`, else ValueError with what is wrong."""
    if not isinstance(action, dict):
        raise ValueError(f"an action is a JSON object, got {type(action).__name__}")
    extra = sorted(set(action) - {"message", "guess", "metadata"})
    if extra:
        raise ValueError(f'unknown action field(s) {extra}; an action is {{"message": text}} or {{"guess": word}}')
    if "message" not in action and "guess" not in action:
        raise ValueError("an action needs 'message' (or 'guess')")
    for k in ("message", "guess"):
        if k in action and not isinstance(action[k], str):
            raise ValueError(f"action field {k!r} must be a string, got {type(action[k]).__name__}")
    return action


def _reset_args(data: Any) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"reset parameters are a JSON object, got {type(data).__name__}")
    return {k: data[k] for k in ("seed", "max_guesses") if k in data and data[k] is not None}


def _result(obs: dict, reward: float | None, done: bool) -> dict[str, Any]:
    return {"observation": obs, "reward": reward, "done": done}


# ----------------------------------------------------------------------------- the app


class Sessions:
    """Episodes kept between HTTP calls (the oldest dropped past ``limit``)."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit, self._games, self._lock = limit, OrderedDict(), threading.Lock()

    def new(self, game: Game) -> str:
        sid = uuid.uuid4().hex
        with self._lock:
            self._games[sid] = game
            while len(self._games) > self.limit:
                self._games.popitem(last=False)
        return sid

    def get(self, sid: Any) -> Game | None:
        with self._lock:
            return self._games.get(sid) if isinstance(sid, str) else None


def create_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocket, WebSocketDisconnect

    sessions = Sessions()

    async def body(request: Request) -> Any:
        raw = await request.body()
        return json.loads(raw) if raw.strip() else {}

    async def reset(request: Request) -> JSONResponse:
        try:
            game = Game(**_reset_args(await body(request)))
        except (ValueError, TypeError) as e:
            return JSONResponse({"detail": str(e)}, status_code=422)
        return JSONResponse({**_result(game.observation(), None, False), "session_id": sessions.new(game)})

    async def step(request: Request) -> JSONResponse:
        try:
            data = await body(request)
            if not isinstance(data, dict) or "action" not in data:
                raise ValueError('a step is {"action": {...}, "session_id": ...}')
            action = check_action(data["action"])
        except ValueError as e:
            return JSONResponse({"detail": str(e)}, status_code=422)
        game = sessions.get(data.get("session_id"))
        if game is None:
            return JSONResponse(
                {"detail": "unknown session_id: POST /reset first and send the session_id it gave"}, status_code=404
            )
        try:
            return JSONResponse(_result(*game.step(action)))
        except RuntimeError as e:
            return JSONResponse({"detail": str(e)}, status_code=409)

    async def state(request: Request) -> JSONResponse:
        game = sessions.get(request.query_params.get("session_id"))
        if game is None:
            return JSONResponse({"detail": "unknown session_id"}, status_code=404)
        return JSONResponse(game.state())

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "healthy"})

    async def metadata(request: Request) -> JSONResponse:
        return JSONResponse(
            {"name": "wordgame", "description": "guess a secret five-letter word in six tries", "version": "1.0"}
        )

    async def schema(request: Request) -> JSONResponse:
        return JSONResponse({"action": ACTION_SCHEMA, "observation": {"type": "object"}, "state": {"type": "object"}})

    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        game: Game | None = None
        try:
            while True:
                raw = await websocket.receive_text()
                try:
                    msg = json.loads(raw)
                except json.JSONDecodeError as e:
                    await websocket.send_json(
                        {"type": "error", "data": {"message": f"Invalid JSON: {e}", "code": "INVALID_JSON"}}
                    )
                    continue
                kind = msg.get("type") if isinstance(msg, dict) else None
                try:
                    if kind == "reset":
                        try:
                            game = Game(**_reset_args(msg.get("data")))
                        except (ValueError, TypeError) as e:
                            raise _Invalid(str(e)) from None
                        reply = {"type": "observation", "data": _result(game.observation(), None, False)}
                    elif kind == "step":
                        try:
                            action = check_action(msg.get("data"))
                        except ValueError as e:
                            raise _Invalid(str(e)) from None
                        if game is None:
                            raise RuntimeError("no episode: send a reset first")
                        reply = {"type": "observation", "data": _result(*game.step(action))}
                    elif kind == "state":
                        reply = {"type": "state", "data": game.state() if game else {}}
                    elif kind == "close":
                        break
                    else:
                        reply = {
                            "type": "error",
                            "data": {"message": f"Unknown message type: {kind}", "code": "UNKNOWN_TYPE"},
                        }
                except _Invalid as e:
                    reply = {"type": "error", "data": {"message": str(e), "code": "VALIDATION_ERROR"}}
                except Exception as e:  # noqa: BLE001 - as OpenEnv answers an environment that raised
                    reply = {"type": "error", "data": {"message": str(e), "code": "EXECUTION_ERROR"}}
                await websocket.send_json(reply)
        except WebSocketDisconnect:
            return
        await websocket.close()

    return Starlette(
        routes=[
            Route("/reset", reset, methods=["POST"]),
            Route("/step", step, methods=["POST"]),
            Route("/state", state),
            Route("/health", health),
            Route("/metadata", metadata),
            Route("/schema", schema),
            WebSocketRoute("/ws", ws),
        ]
    )


class _Invalid(ValueError):
    """A message that does not fit the protocol (OpenEnv's VALIDATION_ERROR)."""


app = create_app()


# ----------------------------------------------------------------------------- a scripted player

_ROW = re.compile(r"^\s+([a-z]{5}) ([GY.] [GY.] [GY.] [GY.] [GY.])\s*$", re.M)


def fits(word: str, board: list[tuple[str, str]]) -> bool:
    return all(marks(word, g) == m for g, m in board)


def player(messages: Any) -> str:
    """A scripted stand-in for a model (see the module docstring): with "feedback" in its system
    message it plays a word that fits every mark on the board of the last observation; without,
    it tries words from a fixed list in order. Deterministic."""

    def field(m: Any, key: str) -> str:
        return str(m.get(key, "") if isinstance(m, dict) else getattr(m, key, ""))

    msgs = list(messages)
    system = " ".join(field(m, "content") for m in msgs if field(m, "role") == "system").lower()
    last = next((field(m, "content") for m in reversed(msgs) if field(m, "role") == "user"), "")
    board = [(g, m.replace(" ", "")) for g, m in _ROW.findall(last)]
    if "feedback" in system:
        tried = {g for g, _ in board}
        candidates = [w for w in WORDS if w not in tried and fits(w, board)]
        return (candidates or list(WORDS))[0]
    return ("crane", "sloth", "pudgy", "wimpy", "vexed", "jokes")[len(board) % 6]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="the word-game environment server (OpenEnv-style /ws, /reset, /step)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
