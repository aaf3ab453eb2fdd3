//! `cachealloc completions SHELL`: the shell completion script, on stdout
//! (e.g. `cachealloc completions bash > /etc/bash_completion.d/cachealloc`).

use clap::{Args, CommandFactory};
use clap_complete::Shell;

/// Print a shell completion script.
#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell.
    shell: Shell,
}

impl CompletionsArgs {
    /// Run; the exit status.
    pub fn run<C: CommandFactory>(self) -> u8 {
        let mut cmd = C::command();
        clap_complete::generate(self.shell, &mut cmd, "cachealloc", &mut std::io::stdout());
        0
    }
}
