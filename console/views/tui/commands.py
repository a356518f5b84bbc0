"""The command palette (ctrl+p): every action of the console, and every rank to open."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.screen import Screen

PaletteCommand = tuple[str, str, Callable[[], object]]


class HasPalette(Protocol):
    """The app the palette serves (MsconApp): it lists the commands for the screen shown."""

    def palette_commands(self, screen: Screen[object]) -> list[PaletteCommand]: ...


class MsconCommands(Provider):
    def _commands(self) -> list[PaletteCommand]:
        app = cast(HasPalette, self.app)
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
