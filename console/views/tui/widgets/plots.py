"""Line plots: plotext (through textual-plotext) where installed, else Textual's Sparkline."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Label, Sparkline

try:  # optional: the richer plot
    from textual_plotext import PlotextPlot
except ImportError:  # pragma: no cover - depends on the environment
    PlotextPlot = None  # type: ignore[assignment,misc]

HAVE_PLOTEXT = PlotextPlot is not None


class SeriesPlot(Widget):
    DEFAULT_CSS = """
    SeriesPlot { height: 1fr; width: 1fr; min-height: 4; }
    SeriesPlot > Label { width: 1fr; color: $text-muted; }
    SeriesPlot > Sparkline { height: 1fr; }
    """

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self._data: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())

    def compose(self) -> ComposeResult:
        if PlotextPlot is not None:
            yield PlotextPlot()
        else:
            yield Label(self.title)
            yield Sparkline([])

    def set_data(self, xs: Sequence[float], ys: Sequence[float], title: str | None = None) -> None:
        data = (tuple(xs), tuple(ys))
        if title is not None and title != self.title:
            self.title = title
        elif data == self._data:
            return
        self._data = data
        if PlotextPlot is not None:
            plot = self.query_one(PlotextPlot)
            plt = plot.plt
            plt.clear_data()
            plt.clear_figure()
            plt.title(self.title)
            if xs:
                plt.plot(list(xs), list(ys), marker="braille")
            plot.refresh()
        else:
            self.query_one(Label).update(f"{self.title}: {ys[-1]:.4g}" if ys else self.title)
            self.query_one(Sparkline).data = list(ys[-200:])
