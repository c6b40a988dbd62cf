"""``ConfigPanel``: an ipywidgets form for :class:`~notebook_kit.config.launch_config.LaunchConfig`.

The panel holds no state of its own: the widget values are the config. Every change, from a
click or from code, re-validates the form, shows problems next to the offending field and
refreshes the equivalent Python call and command line, so an experiment can become a script.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from notebook_kit.config.command_line import launch_command_line
from notebook_kit.config.environment import gpu_count, usable_cpu_count
from notebook_kit.config.launch_config import (
    LaunchConfig,
    default_config_path,
    field_errors,
    read_saved_default,
)
from notebook_kit.config.schema import SETTINGS, choice_words, parse_text

__all__ = ["ConfigPanel"]

_HELP_COLOUR, _ERROR_COLOUR = "#666", "#b00020"


# A dropdown's "auto" entry needs a value other than None: ipywidgets shows None as no choice.
_AUTO = "auto"


def _is_text(field: str) -> bool:
    """Typed as text: the address, and numbers that may be empty ("auto"/"none"), which
    IntText cannot hold."""
    return SETTINGS[field].widget == "text"


def _has_auto_entry(field: str) -> bool:
    return SETTINGS[field].widget != "text" and SETTINGS[field].optional


def _new_widget(field: str, process_limit: int) -> widgets.ValueWidget:
    """The widget the schema asks for: dropdowns for choices, bounded boxes for counts."""
    # Labels are the field names, in full: as wide as the longest name, in character widths
    # (the label font's "0" is at least as wide as its average letter), plus a margin.
    label_chars = max(len(name) for name in SETTINGS) + 2
    common: dict[str, Any] = {
        "description": field,
        "style": {"description_width": f"{label_chars}ch"},
        "layout": widgets.Layout(width=f"calc({label_chars}ch + 160px)"),  # label, 160px box
    }
    setting = SETTINGS[field]
    if setting.widget == "processes":
        options = [("auto", _AUTO)] + [(str(n), n) for n in range(1, process_limit + 1)]
        return widgets.Dropdown(options=options, **common)
    if setting.widget == "choice" and setting.kind == "bool":
        words = [("on", True), ("off", False)]
        return widgets.Dropdown(options=[("auto", _AUTO), *words][not setting.optional :], **common)
    if setting.widget == "choice":
        options = [(word, _AUTO if word == "auto" else word) for word in choice_words(field)]
        return widgets.Dropdown(options=options, **common)
    if setting.widget == "count" and setting.upper is not None:
        return widgets.BoundedIntText(min=setting.minimum, max=setting.upper, **common)
    if setting.widget == "count":
        return widgets.IntText(**common)
    return widgets.Text(placeholder=setting.placeholder, continuous_update=False, **common)


def _fix_hint(fields: list[str]) -> str:
    """What the code area says while fields are invalid: which ones, and where the reason is."""
    names = fields[0] if len(fields) == 1 else f"{', '.join(fields[:-1])} and {fields[-1]}"
    where = "message beside it" if len(fields) == 1 else "messages beside them"
    return f"Fix {names} (see the red {where}) to see the equivalent code."


class ConfigPanel(widgets.VBox):
    """A form for every LaunchConfig field, with Save-as-default and Load buttons.

    Args:
        config: Initial values; default: the saved default, else the built-in defaults.
        function_name: Name used for the training function in the rendered Python call.
        script: Script name used in the rendered command line.

    Example:
        >>> panel = ConfigPanel()
        >>> panel.widgets["mixed_precision"].value = "bf16"
        >>> panel.config.mixed_precision
        'bf16'
    """

    def __init__(
        self,
        config: LaunchConfig | None = None,
        *,
        function_name: str = "train",
        script: str = "train.py",
    ) -> None:
        self.function_name, self.script = function_name, script
        self._updating = False
        self._baseline, load_problem = self._read_saved_default()
        detected = gpu_count()
        self.process_limit = detected if detected > 0 else usable_cpu_count()
        self.widgets: dict[str, widgets.ValueWidget] = {}
        self.notes: dict[str, widgets.HTML] = {}
        rows = []
        for field in SETTINGS:
            self.widgets[field] = _new_widget(field, self.process_limit)
            self.widgets[field].add_class(f"nk-field-{field}")  # to find it by
            self.notes[field] = widgets.HTML(layout=widgets.Layout(margin="0 0 0 12px"))
            rows.append(widgets.HBox([self.widgets[field], self.notes[field]]))
            self.widgets[field].observe(self._on_change, names="value")
        self.save_button = widgets.Button(description="Save as default", icon="save")
        self.load_button = widgets.Button(description="Load default", icon="folder-open")
        self.save_button.on_click(self._on_save)
        self.load_button.on_click(self._on_load)
        self.status = widgets.HTML()
        self.code = widgets.HTML()
        super().__init__(
            [*rows, widgets.HBox([self.save_button, self.load_button, self.status]), self.code]
        )
        self.add_class("nk-config-panel")
        self.config = config if config is not None else self._baseline or LaunchConfig()
        if load_problem:
            self._set_status(load_problem, error=True)

    @staticmethod
    def _read_saved_default() -> tuple[LaunchConfig | None, str | None]:
        saved, problem = read_saved_default()
        if problem is not None:
            return None, f"The saved default could not be read: {problem}"
        return saved, None

    # -- values ------------------------------------------------------------------------------

    def _values(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Field values read from the widgets, and the problems with them."""
        values: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for field, widget in self.widgets.items():
            if _is_text(field):
                try:
                    values[field] = parse_text(field, widget.value)
                except (TypeError, ValueError) as error:
                    errors[field] = str(error)
            elif _has_auto_entry(field) and widget.value == _AUTO:
                values[field] = None
            else:
                values[field] = widget.value
        for field, message in field_errors(values).items():
            errors.setdefault(field, message)
        return values, errors

    @property
    def errors(self) -> dict[str, str]:
        """Field name -> message for every invalid field; empty when the form is valid."""
        return self._values()[1]

    @property
    def config(self) -> LaunchConfig:
        """The LaunchConfig the widgets describe.

        Raises:
            ValueError: Some fields are invalid; the message lists them.
        """
        values, errors = self._values()
        if errors:
            problems = "\n".join(f"  {message}" for message in errors.values())
            raise ValueError(f"The config panel has invalid values:\n{problems}")
        return LaunchConfig.from_dict(values)

    @config.setter
    def config(self, config: LaunchConfig) -> None:
        self._updating = True  # one refresh after all widgets changed, not one per widget
        try:
            for field, value in config.to_dict().items():
                widget = self.widgets[field]
                if _is_text(field):
                    widget.value = "" if value is None else str(value)
                    continue
                if field == "num_processes" and value is not None and value > self.process_limit:
                    # A config written for a bigger machine must still be shown as it is.
                    widget.options = [*widget.options, (str(value), value)]
                widget.value = _AUTO if value is None and _has_auto_entry(field) else value
        finally:
            self._updating = False
        self._refresh()

    # -- rendering ---------------------------------------------------------------------------

    def _on_change(self, change: dict[str, Any]) -> None:
        if not self._updating:
            self._refresh()

    def _refresh(self) -> None:
        values, errors = self._values()
        for field, note in self.notes.items():
            message = errors.get(field)
            text, colour = (
                (message, _ERROR_COLOUR) if message else (SETTINGS[field].help, _HELP_COLOUR)
            )
            note.value = f'<span style="color:{colour}">{html.escape(text)}</span>'
            (note.add_class if message else note.remove_class)("nk-error")
        if errors:
            self.code.value = f"<i>{html.escape(_fix_hint(list(errors)))}</i>"
            return
        config = LaunchConfig.from_dict(values)
        self.code.value = (
            "<b>Python</b><pre>"
            + html.escape(self.python_call(config))
            + "</pre><b>Command line</b><pre>"
            + html.escape(launch_command_line(config, self.script, self._baseline))
            + "</pre>"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        """The live form, plus a static rendering for where widgets cannot run.

        A saved notebook read on GitHub or through nbconvert without widget state shows the
        settings and the equivalent code instead of the widget's repr.
        """
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        try:
            config = self.config
        except ValueError as error:  # invalid values: say so rather than show a stale config
            text = f"ConfigPanel with invalid values: {error}"
            return {**bundle, "text/plain": text, "text/html": f"<pre>{html.escape(text)}</pre>"}
        text = f"{self.python_call(config)}\n\n{self.command_line()}"
        return {
            **bundle,
            "text/plain": f"ConfigPanel\n{text}",
            "text/html": f"<b>ConfigPanel</b><pre>{html.escape(text)}</pre>",
        }

    def python_call(self, config: LaunchConfig | None = None) -> str:
        """Python code that launches ``function_name`` with this panel's config.

        Example::

            print(ConfigPanel(LaunchConfig(num_processes=2)).python_call())
            # from notebook_kit import LaunchConfig, notebook_launcher
            # ...
        """
        config = config if config is not None else self.config
        builtin = LaunchConfig()
        changed = [
            f"{field}={json.dumps(value) if isinstance(value, str) else repr(value)}"
            for field, value in config.to_dict().items()
            if value != getattr(builtin, field)
        ]
        arguments = ", ".join(changed)
        if len(arguments) > 70:  # one argument per line, as a formatter would write it
            arguments = "\n" + "".join(f"    {argument},\n" for argument in changed)
        return (
            "from notebook_kit import LaunchConfig, notebook_launcher\n\n"
            f"config = LaunchConfig({arguments})\n"
            f"notebook_launcher({self.function_name}, args=(), config=config)"
        )

    def command_line(self) -> str:
        """The ``notebook-kit launch`` command equivalent to this panel's config."""
        return launch_command_line(self.config, self.script, self._baseline)

    def _set_status(self, text: str, *, error: bool = False) -> None:
        colour = _ERROR_COLOUR if error else _HELP_COLOUR
        self.status.value = f'<span style="color:{colour}">{html.escape(text)}</span>'

    # -- buttons -----------------------------------------------------------------------------

    def _on_save(self, _button: widgets.Button | None = None) -> None:
        try:
            config = self.config
            path = config.save()
        except (OSError, ValueError) as error:
            self._set_status(f"Not saved: {error}", error=True)
            return
        self._baseline = config
        self._refresh()
        self._set_status(f"Saved to {path}")

    def _on_load(self, _button: widgets.Button | None = None) -> None:
        saved, problem = self._read_saved_default()
        if problem:
            self._set_status(problem, error=True)
            return
        if saved is None:
            self._set_status(f"No saved default at {default_config_path()}", error=True)
            return
        self._baseline = saved
        self.config = saved
        self._set_status(f"Loaded {default_config_path()}")

    # -- launching ---------------------------------------------------------------------------

    def launch(
        self, function: Callable[..., Any], args: tuple[Any, ...] = (), **kwargs: Any
    ) -> Any:
        """Run ``function(*args)`` with ``notebook_launcher`` and this panel's config.

        Extra keyword arguments go to ``notebook_launcher`` and win over the panel.

        Raises:
            ValueError: The panel has invalid values.

        Example::

            panel.launch(train, args=(model,))
        """
        # At call time: the launcher imports torch, which showing a panel does not need.
        from notebook_kit.launch.launcher import notebook_launcher

        return notebook_launcher(function, args=args, config=self.config, **kwargs)
