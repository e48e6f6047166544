package main

import (
	"errors"
	"io"

	"github.com/AlecAivazis/survey/v2"
	"github.com/AlecAivazis/survey/v2/terminal"
	"github.com/hagroup/hagroup/pkg/secret"
)

// Prompter asks the operator questions. survey backs it on a terminal;
// survey is archived upstream, so nothing else depends on it.
type Prompter interface {
	// Confirm asks a yes/no question.
	Confirm(question string) (bool, error)
	// Password asks for a secret without echo.
	Password(question string) (secret.PIN, error)
}

// errNoTerminal is returned by a prompter that may not ask.
var errNoTerminal = errors.New("no terminal to prompt on (use --yes or the non-interactive flags)")

// noPrompter never prompts: with --yes it confirms, otherwise it fails,
// and it never asks for a secret.
type noPrompter struct{ yes bool }

func (p noPrompter) Confirm(string) (bool, error) {
	if p.yes {
		return true, nil
	}
	return false, errNoTerminal
}

func (p noPrompter) Password(string) (secret.PIN, error) { return secret.PIN{}, errNoTerminal }

type surveyPrompter struct {
	opt survey.AskOpt
}

func newSurveyPrompter(in io.Reader, out, errOut io.Writer) Prompter {
	fin, _ := in.(terminal.FileReader)
	fout, _ := out.(terminal.FileWriter)
	return surveyPrompter{opt: survey.WithStdio(fin, fout, errOut)}
}

func (p surveyPrompter) Confirm(q string) (bool, error) {
	var ok bool
	err := survey.AskOne(&survey.Confirm{Message: q}, &ok, p.opt)
	return ok, promptError(err)
}

func (p surveyPrompter) Password(q string) (secret.PIN, error) {
	var s string
	err := survey.AskOne(&survey.Password{Message: q}, &s, p.opt)
	pin := secret.PINFromString(s)
	return pin, promptError(err)
}

// promptError turns Ctrl-C at a prompt (the terminal is raw: no SIGINT is
// sent) into errInterrupted, for exit code 130.
func promptError(err error) error {
	if errors.Is(err, terminal.InterruptErr) {
		return errInterrupted
	}
	return err
}
