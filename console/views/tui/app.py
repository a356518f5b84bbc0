"""``MsconApp``: the live console (``mscon up``) and the replay viewer, one thin Textual app.

The source (a live Supervisor in this loop, or a recording) hands every event to ``Feed.handle``,
which only appends; the buffer is drained (and what is on screen updated) as soon as the first event
after a quiet spell arrives, then at most every few times the last flush's cost (so that under load
events coalesce and the view stays a small share of a core), and at least every ``flush_s``.
The app holds no policy: it reads ClusterState and sends StopJob / RestartGroup.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path

from mscon.console.engine.collector import FreezeAfterSlowPasses
from mscon.console.engine.commands import DetachRun, RestartGroup, StopJob
from mscon.console.views.tui.commands import MsconCommands, PaletteCommand
from mscon.console.views.tui.feed import Changes, Feed
from mscon.console.views.tui.linestore import LineStore
from mscon.console.views.tui.model import PANE_LIMIT, ViewModel
from mscon.console.views.tui.screens.failure import restart_outlook_text
from mscon.console.views.tui.screens.main import MainScreen, View
from mscon.console.views.tui.screens.modals import ConfirmScreen, HelpScreen, QuitChoice, QuitScreen, key_rows
from mscon.console.views.tui.screens.rank import RankScreen
from mscon.console.views.tui.source import Source
from mscon.console.views.tui.terminal import DRIVER
from mscon.console.views.tui.textual_compat import app_driver
from textual.app import App, ScreenStackError
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen

FLUSH_S = 0.25  # the longest an event waits for a flush (the timer's period)
MIN_GAP_S = 0.033  # the shortest pause between two flushes
GAP_FACTOR = 3.0  # ... and at least this many times the last flush's cost (its share of a core <= 1/4)

RESTART_BODY = (
    "Every rank on every node is stopped and the whole group starts again as a new attempt, from "
    "its latest complete snapshot or checkpoint (a rank cannot rejoin a running collective). An "
    "operator's restart does not use up the failure restart budget."
)
STOP_BODY = (
    "Every rank on every node is stopped (TERM, then KILL after the grace period); the logs are "
    "fetched and the run ends as interrupted. The console stays open to read the results."
)


class MsconApp(App[int]):
    TITLE = "mscon"
    CSS_PATH = "styles.tcss"
    COMMANDS = App.COMMANDS | {MsconCommands}
    BINDINGS = [
        Binding("r", "restart", "Restart group"),
        Binding("s", "stop", "Stop run"),
        Binding("d", "detach", "Detach"),
        Binding("q", "request_quit", "Quit"),
        Binding("ctrl+q", "request_quit", "Quit", show=False, priority=True),
        Binding("ctrl+c", "request_quit", "Quit", show=False, priority=True),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(
        self,
        source: Source,
        *,
        pane_limit: int = PANE_LIMIT,
        flush_s: float = FLUSH_S,
        spool_dir: Path | None = None,
        exit_when_done: bool = False,
        on_paint: Callable[[Changes, float, float], None] | None = None,
        toasts: bool = True,
    ) -> None:
        super().__init__(driver_class=DRIVER)
        self.source = source
        self.store = LineStore(spool_dir)
        self.feed = Feed(source, self.store)
        self.model = ViewModel(source, self.feed, self.store, pane_limit)
        self.flush_s = flush_s
        self.exit_when_done = exit_when_done  # quit once the run has ended (after "stop and quit")
        self.on_paint = on_paint  # bench hook: (changes, flush start, paint time)
        self.toasts = toasts  # pop-up notes for run events (off for snapshots: they time out)
        self.main_screen = MainScreen(self.model)
        self._done_seen = False
        self.flushes = 0
        self._flushing = False
        self._frozen = False
        self._flush_asked = False  # a flush is due (asked for by the first event after a drain)
        self._last_flush = 0.0  # perf_counter() when the last flush started
        self._gap = MIN_GAP_S  # the pause before the next flush, from the last flush's cost
        self.collector = FreezeAfterSlowPasses()

    # ------------------------------------------------------------ life cycle

    def on_mount(self) -> None:
        self.push_screen(self.main_screen)
        self.collector.install()
        self.feed.wake = self._wake
        self.source.start(self.feed.handle)
        self.set_interval(self.flush_s, self.flush, name="flush")

    def _wake(self) -> None:
        """The first event since the last drain: flush at once if the view has been idle long
        enough, else as soon as the gap since the last flush allows (events coalesce meanwhile)."""
        if self._flush_asked:
            return
        self._flush_asked = True
        delay = self._last_flush + self._gap - time.perf_counter()
        if delay > 0.001:
            self.set_timer(delay, self._woken_flush, name="flush-soon")
        else:
            self.call_later(self._woken_flush)

    async def _woken_flush(self) -> None:
        self._flush_asked = False
        await self.flush()

    def on_unmount(self) -> None:
        self.collector.uninstall()
        self.store.close()

    async def flush(self) -> None:
        """Drain the buffer into the screen on top (hidden screens and tabs catch up when shown)."""
        if self._flushing:
            return
        self._flushing = True
        try:
            await self._flush_feed()
        finally:
            self._flushing = False

    # Not ``_flush``: Textual's App has a private ``_flush(stderr)`` (print capture) this would replace.
    async def _flush_feed(self) -> None:
        if not self._frozen and self.main_screen.ready:
            # The app's own objects (modules, widgets, styles) live as long as it does: kept out of
            # the collector's full passes, which otherwise stall a paint by 50-150 ms at 1,024 ranks.
            self._frozen = True
            gc.freeze()
        t0 = self._last_flush = time.perf_counter()
        ch = self.feed.drain()
        self.flushes += 1
        if ch.failure or ch.structure:
            self.model.invalidate_roles()
        try:
            screen = self.screen
        except ScreenStackError:  # the app is closing: events that arrive now have no view left
            return
        try:
            if isinstance(screen, RankScreen):
                screen.show(ch)
                self.main_screen.stale = self.main_screen.stale or bool(ch)
            elif screen is self.main_screen:
                await self.main_screen.show(ch)
            else:  # a dialog: the screen beneath catches up when it is back on top
                self.main_screen.stale = self.main_screen.stale or bool(ch)
        except NoMatches:  # a screen being built or torn down (start-up, exit): the next flush
            self.main_screen.stale = True
        for note in ch.notices if self.toasts else ():
            self.notify(note, timeout=6)
        self._repaint_if_dropped()
        hook = self.on_paint
        if ch.events:

            def painted() -> None:
                now = time.perf_counter()
                self._gap = min(self.flush_s, max(MIN_GAP_S, GAP_FACTOR * (now - t0)))
                if hook is not None:
                    hook(ch, t0, now)

            self.call_after_refresh(painted)
        if self.source.done.is_set() and not self._done_seen and not self.feed.backlog:
            self._done_seen = True
            self._finished()

    def _repaint_if_dropped(self) -> None:
        driver = app_driver(self)
        if getattr(driver, "needs_repaint", False) and driver is not None and driver.backlog() == 0:  # type: ignore[attr-defined]
            driver.needs_repaint = False  # type: ignore[attr-defined]
            self.refresh(repaint=True, layout=True)

    def _finished(self) -> None:
        result = self.source.result
        code = result.exit_code if result is not None else 0
        if self.exit_when_done:
            self.exit(code)
            return
        if not self.toasts:
            return
        if result is not None:
            self.notify(
                f"The run ended: {result.status.value} (exit code {code}). q quits.",
                severity="error" if code else "information",
                timeout=15,
            )
        else:
            self.notify("The replay is over. q quits.", timeout=10)

    # ------------------------------------------------------------ actions

    def _command_allowed(self) -> bool:
        if not self.source.accepts_commands:
            self.notify("This is a replay: commands are not sent anywhere.", severity="warning")
            return False
        if self.source.done.is_set():
            self.notify("The run has ended.", severity="warning")
            return False
        return True

    def action_restart(self) -> None:
        if not self._command_allowed():
            return

        def answer(yes: bool | None) -> None:
            if yes and self.source.submit(RestartGroup("restart requested from the console")):
                self.notify(
                    "Restart requested: the whole group restarts from its latest snapshot or checkpoint."
                )

        body = f"{RESTART_BODY}\n\nIt starts {restart_outlook_text(self.source.state)}."
        self.push_screen(ConfirmScreen("Restart the whole group?", body, "Restart"), answer)

    def action_stop(self) -> None:
        if not self._command_allowed():
            return

        def answer(yes: bool | None) -> None:
            if yes and self.source.submit(StopJob("stopped from the console")):
                self.notify("Stopping every rank on every node…")

        self.push_screen(ConfirmScreen("Stop the run?", STOP_BODY, "Stop"), answer)

    def action_request_quit(self) -> None:
        if isinstance(self.screen, QuitScreen | ConfirmScreen | HelpScreen):
            return
        if self.source.done.is_set() or not self.source.accepts_commands:
            result = self.source.result
            self.exit(result.exit_code if result is not None and self.source.done.is_set() else 0)
            return

        def answer(choice: QuitChoice | None) -> None:
            if choice is QuitChoice.STOP:
                self.exit_when_done = True
                self.source.submit(StopJob("stopped from the console (quit)"))
                self.notify("Stopping every rank on every node, then quitting…", timeout=30)
            elif choice is QuitChoice.DETACH:
                self.action_detach()

        self.push_screen(QuitScreen(), answer)

    def action_detach(self) -> None:
        """Leave the run going on the nodes; the app ends once the agents have taken it over."""
        if not self._command_allowed():
            return
        refused = self.source.detach_refused
        if refused is not None:
            self.notify(refused, severity="warning")
            return
        self.exit_when_done = True
        self.source.submit(DetachRun("detached from the console"))
        self.notify("Detaching: the run goes on without the console (mscon attach comes back)…", timeout=30)

    async def action_quit(self) -> None:
        self.action_request_quit()

    def action_help(self) -> None:
        screen = self.screen
        if isinstance(screen, HelpScreen):
            return
        title = "Rank log" if isinstance(screen, RankScreen) else "Cluster"
        note = (
            "Mouse: click a tab, a rank pane or a table header (sort). ctrl+p: every action by name. "
            "Colours: failed red, hung magenta, straggler yellow (each also has a word and a marker)."
        )
        if not self.source.accepts_commands:
            note += " This is a replay: r and s are not sent anywhere, q quits."
        self.push_screen(HelpScreen(title, key_rows(screen), note))

    def action_open_rank(self, name: str) -> None:
        in_sight = getattr(self.source, "rank_in_sight", None)
        if in_sight is not None:
            in_sight(name)
        self.push_screen(RankScreen(self.model, name))

    def action_view(self, view: str) -> None:
        if isinstance(self.screen, RankScreen):
            self.pop_screen()
        self.main_screen.action_view(view)

    # ------------------------------------------------------------ palette

    def palette_commands(self, screen: Screen[object]) -> list[PaletteCommand]:
        cmds: list[PaletteCommand] = [
            ("Restart the group", "r: restart every rank from the latest checkpoint", self.action_restart),
            ("Stop the run", "s: stop every rank on every node", self.action_stop),
            ("Quit", "q: stop the run and quit", self.action_request_quit),
            ("Help: keys", "?: every key of this screen", self.action_help),
            ("Filter ranks", "/: by node, state or text", self._palette_filter),
            ("Clear the rank filter", "esc", self._palette_clear_filter),
            ("Sort the rank table", "o: by the next column", self.main_screen.action_sort),
        ]
        for view in View:
            cmds.append((f"Show {view.value.title()}", f"the {view.value} screen", self._show_view(view)))
        if isinstance(screen, RankScreen):
            cmds += [
                ("Back", "esc: to the cluster screens", screen.action_back),
                ("Follow on/off", "f: stick to the end of the log", screen.action_follow),
                ("Search the log", "/: find a text", screen.action_search),
                ("Next match", "n", lambda: screen.action_find(True)),
                ("Previous match", "N", lambda: screen.action_find(False)),
                ("Only matching lines", "&: filter the log by the search", screen.action_filter),
            ]
        for r in self.model.workers():
            cmds.append((f"Open {r.name} on {r.node}", "its full log and plots", self._opener(r.name)))
        return cmds

    def _show_view(self, view: View) -> Callable[[], None]:
        return lambda: self.action_view(view.value)

    def _opener(self, name: str) -> Callable[[], None]:
        return lambda: self.action_open_rank(name)

    def _palette_filter(self) -> None:
        self.action_view(View.DEVICES.value)
        self.main_screen.action_filter()

    async def _palette_clear_filter(self) -> None:
        self.model.set_query("")
        await self.main_screen.show(None)
