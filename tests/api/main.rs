//! Integration tests: the real server on 127.0.0.1:0, through the generated tonic client.

mod cli;
mod conversations;
mod helpers;
mod listing;
mod load;
mod route;
mod server;
mod settings;
