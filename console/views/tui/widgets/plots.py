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

    def __init__(self, title: str, *, x_label: str = "", y_label: str = "", id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self.x_label = x_label  # what each axis measures, with its unit: "step", "samples/s"
        self.y_label = y_label
        self._data: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())

    def compose(self) -> ComposeResult:
        if PlotextPlot is not None:
            yield PlotextPlot()
        else:
            yield Label(self.title)
            yield Sparkline([])

    @property
    def data(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The points drawn: (xs, ys)."""
        return self._data

    def on_mount(self) -> None:
        self._draw()  # the axes' labels show before the first point

    def set_data(
        self, xs: Sequence[float], ys: Sequence[float], title: str | None = None, y_label: str | None = None
    ) -> None:
        data = (tuple(xs), tuple(ys))
        title = self.title if title is None else title
        y_label = self.y_label if y_label is None else y_label
        if (title, y_label, data) == (self.title, self.y_label, self._data):
            return
        self.title, self.y_label = title, y_label
        self._data = data
        self._draw()

    def _draw(self) -> None:
        xs, ys = self._data
        if PlotextPlot is not None:
            plot = self.query_one(PlotextPlot)
            plt = plot.plt
            plt.clear_data()
            plt.clear_figure()
            plt.title(self.title)
            plt.xlabel(self.x_label)
            plt.ylabel(self.y_label)
            if xs and all(float(x).is_integer() for x in xs):  # steps: whole numbers on the axis
                lo, hi = min(xs), max(xs)
                ticks = sorted({round(lo + i * (hi - lo) / 4) for i in range(5)})
                plt.xticks(ticks, [str(t) for t in ticks])
            if xs:
                # A lone point in braille is one dot of eight: a marker that can be seen instead.
                plt.plot(list(xs), list(ys), marker="braille" if len(xs) > 1 else "dot")
            plot.refresh()
        else:
            unit = f" {self.y_label}" if self.y_label else ""
            self.query_one(Label).update(f"{self.title}: {ys[-1]:.4g}{unit}" if ys else self.title)
            self.query_one(Sparkline).data = list(ys[-200:])
