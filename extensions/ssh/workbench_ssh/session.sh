#!/bin/sh
# workbench-ssh session: sshd's ForceCommand for every session of workbench-sshd.
#
#   /bin/sh session.sh HOME SFTP_SERVER
#
# Why it exists: sshd starts every session in the account's passwd home, and
# sshd's SetEnv only fixes $HOME. On the local backend every hub user's server
# runs as one account whose passwd home is not the server's home, so without
# this wrapper `ssh`, `scp`, `rsync` and `sftp` would land somewhere JupyterLab
# never looks. sshd runs the ForceCommand for commands, shells and subsystems
# alike (checked against OpenSSH 9.2: a subsystem request arrives here with the
# subsystem's command in SSH_ORIGINAL_COMMAND). In the docker image the server's
# home is the passwd home, and this changes nothing there.
#
# It enters HOME, then does what sshd itself would have done:
#   * the sftp subsystem (also what scp uses since OpenSSH 9): SFTP_SERVER -d HOME;
#   * a command (`ssh host cmd`, rsync, legacy scp, VS Code): $SHELL -c "$SSH_ORIGINAL_COMMAND";
#   * no command: a login shell.
# SSH_ORIGINAL_COMMAND and OLDPWD are not passed on: a session sees what plain sshd would give it.
set -u

home=$1
sftp_server=$2

if ! cd "$home" 2>/dev/null; then
    echo "workbench-ssh: cannot enter the server's home $home" >&2
    exit 1
fi
unset OLDPWD
shell=${SHELL:-/bin/sh}

if [ -z "${SSH_ORIGINAL_COMMAND+set}" ]; then
    exec "$shell" -l
fi

command=$SSH_ORIGINAL_COMMAND
unset SSH_ORIGINAL_COMMAND

if [ "$command" = "$sftp_server" ]; then
    # sftp-server expands %-tokens in -d's argument: a literal % is %%
    case $home in
        *%*) start=$(printf '%s\n' "$home" | sed 's/%/%%/g') ;;
        *) start=$home ;;
    esac
    exec "$sftp_server" -d "$start"
fi

exec "$shell" -c "$command"
