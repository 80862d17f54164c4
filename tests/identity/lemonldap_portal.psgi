# LemonLDAP::NG's portal as one PSGI application (tests/identity/lemonldap.sh runs it with plackup): its static
# files and the portal, which finds its configuration through LLNG_DEFAULTCONFFILE. No nginx, no FastCGI: one
# process that may run as root (llng-fastcgi-server refuses to).
use strict;
use Plack::Builder;
use Plack::App::File;
use Lemonldap::NG::Portal::Main;

my $portal = Lemonldap::NG::Portal::Main->run( {} );
builder {
    mount '/static/' =>
      Plack::App::File->new( root => '/usr/share/lemonldap-ng/portal/htdocs/static' )->to_app;
    mount '/javascript/' => Plack::App::File->new( root => '/usr/share/javascript' )->to_app;
    mount '/'            => $portal;
};
