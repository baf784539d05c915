//! Where the pixels of an image a step was given lie on the decoded frame: a detector fed by
//! `resize` or `crop` finds boxes in that smaller image, and whoever shows them over the frame
//! (the live page, `/api/live`) maps them back with a [`Place`]. Each image step says how its
//! output lies on its input ([`Placement`], from `Step::placement`); the workflow chains them
//! from `$frame` down to the image a step read (`Graph::placements`); the frame's size turns the
//! chain into a scale and an offset ([`Place::of`]).

/// How a step's image output lies on its `image` input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// The same pixels, at the same place (the default: `annotate`, `blur`, `grayscale`).
    #[default]
    Same,
    /// A rectangle of the input, unscaled (`crop`).
    Cut {
        x: i32,
        y: i32,
        width: i32,
        height: i32,
    },
    /// The whole input, scaled to this size (`resize`).
    Scaled { width: i32, height: i32 },
}

/// From an image's pixels to the frame's: `frame = image x scale + offset`, on each axis.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Place {
    pub scale: [f32; 2],
    pub offset: [f32; 2],
}

impl Default for Place {
    fn default() -> Self {
        Self::SAME
    }
}

impl Place {
    /// The frame itself.
    pub const SAME: Self = Self {
        scale: [1.0, 1.0],
        offset: [0.0, 0.0],
    };

    /// The place of the image made by `chain` (from the frame's side) out of a frame of
    /// `width` x `height`.
    pub fn of(chain: &[Placement], width: i32, height: i32) -> Self {
        let mut place = Self::SAME;
        let mut size = [width as f32, height as f32];
        for p in chain {
            match *p {
                Placement::Same => {}
                Placement::Cut {
                    x,
                    y,
                    width,
                    height,
                } => {
                    place.offset[0] += x as f32 * place.scale[0];
                    place.offset[1] += y as f32 * place.scale[1];
                    size = [width as f32, height as f32];
                }
                Placement::Scaled { width, height } => {
                    let to = [width.max(1) as f32, height.max(1) as f32];
                    place.scale[0] *= size[0] / to[0];
                    place.scale[1] *= size[1] / to[1];
                    size = to;
                }
            }
        }
        place
    }

    pub fn is_same(&self) -> bool {
        *self == Self::SAME
    }

    /// A point of the image, on the frame.
    pub fn point(&self, [x, y]: [f32; 2]) -> [f32; 2] {
        [
            x * self.scale[0] + self.offset[0],
            y * self.scale[1] + self.offset[1],
        ]
    }

    /// A box of the image (`[x, y, width, height]`), on the frame.
    pub fn rect(&self, [x, y, w, h]: [f32; 4]) -> [f32; 4] {
        let [x, y] = self.point([x, y]);
        [x, y, w * self.scale[0], h * self.scale[1]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_box_of_a_resized_crop_lands_where_it_was_on_the_frame() {
        // 1920x1080, cut 960x540 at (960, 0), scaled to 480x270: a pixel of it is 2 of the
        // frame's, 960 to the right.
        let chain = [
            Placement::Same,
            Placement::Cut {
                x: 960,
                y: 0,
                width: 960,
                height: 540,
            },
            Placement::Scaled {
                width: 480,
                height: 270,
            },
        ];
        let place = Place::of(&chain, 1920, 1080);
        assert_eq!(
            place.rect([10.0, 20.0, 30.0, 40.0]),
            [980.0, 40.0, 60.0, 80.0]
        );
        // A crop of a resized frame: the cut's offset is in the small image's pixels.
        let chain = [
            Placement::Scaled {
                width: 960,
                height: 540,
            },
            Placement::Cut {
                x: 100,
                y: 50,
                width: 200,
                height: 200,
            },
        ];
        let place = Place::of(&chain, 1920, 1080);
        assert_eq!(place.point([0.0, 0.0]), [200.0, 100.0]);
        assert_eq!(place.point([10.0, 10.0]), [220.0, 120.0]);
        assert!(Place::of(&[Placement::Same], 640, 480).is_same());
    }
}
