"""The command palette (ctrl+p): every action of the console, and every rank to open."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from mscon.console.views.tui.app import MsconApp

PaletteCommand = tuple[str, str, Callable[[], object]]


class MsconCommands(Provider):
    def _commands(self) -> list[PaletteCommand]:
        app = cast("MsconApp", self.app)
        return app.palette_commands(self.screen)

    async def discover(self) -> Hits:
        for name, help_text, callback in self._commands():
            if not name.startswith("Open r"):
                yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), partial(callback), help=help_text)
