//! Integration tests: the real server on 127.0.0.1:0, through the generated tonic client.

mod cli;
mod conversations;
mod domains;
mod faults;
mod formats;
mod helpers;
mod listing;
mod load;
mod operate;
mod process;
mod profiles;
mod reload;
mod route;
mod search;
mod security;
mod server;
mod settings;
mod watch;
